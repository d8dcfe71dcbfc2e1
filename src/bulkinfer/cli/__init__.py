"""The ``bulkinfer`` command: parse, build the config, call the library, map errors to exit codes.

Exit codes: 0 done; 1 failed; 2 usage error; 75 interrupted but resumable.
"""

from __future__ import annotations

from .common import LineFormat, app, fields_epilog
from .outputs import compare, costs, index, inspect, report, review, skew
from .run import run
from .serve import serve
from .tune import machine, tune

# the commands, in the order --help lists them
app.command(epilog=fields_epilog())(run)
for command in (tune, machine, serve, inspect, index, compare, report, costs, review, skew):
    app.command()(command)

__all__ = ["LineFormat", "app", "main"]


def main() -> None:
    """Console entry point."""
    app()
