"""The ``bulkinfer`` command: parse, build the config, call the library, map errors to exit codes.

Exit codes: 0 done; 1 failed; 2 usage error; 75 interrupted but resumable.
"""

from __future__ import annotations

from .common import _fields_epilog, _LineFormat, app
from .outputs import compare, costs, index, inspect, report
from .run import run
from .serve import serve
from .tune import machine, tune

# the commands, in the order --help lists them
app.command(epilog=_fields_epilog())(run)
for command in (tune, machine, serve, inspect, index, compare, report, costs):
    app.command()(command)

__all__ = ["_LineFormat", "app", "main"]


def main() -> None:
    """Console entry point."""
    app()
