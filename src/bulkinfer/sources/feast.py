"""Feast as the source of a job's features (``source.kind = "feast"``): the entity table is an
input of today (entity keys and event timestamps, sharded and read as any file), and each window of
its rows gets its point-in-time features from the team's feature store
(``get_historical_features``), or, online, the latest ones (``get_online_features``).

Everything that touches Feast is here: opening the repo, checking the feature refs against its
registry before any row runs, the digest of the feature views' definitions (part of the job's
fingerprint: a changed definition is a new job, :meth:`FeatureRefs.digest`), and the two readers.
Feast is imported here only.
"""

from __future__ import annotations

import difflib
import hashlib
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.errors import ConfigError

__all__ = [
    "FeatureRefs",
    "HistoricalFeatures",
    "OnlineFeatures",
    "open_store",
    "service_refs",
]

POSITION = "__bulkinfer_position"
"""The entity frame's column that puts Feast's answer (in its own order) back in the rows' order."""


def open_store(repo: str, where: str = "source.feast_repo") -> Any:
    """The Feast ``FeatureStore`` of the folder ``repo`` (its ``feature_store.yaml``), or one line."""
    try:
        from feast import FeatureStore
    except ImportError:
        raise ConfigError(f"{where}: Feast is not installed; pip install 'bulkinfer[feast]'") from None
    if not repo:
        raise ConfigError(f"{where}: no Feast repo; name the folder that holds feature_store.yaml")
    if not (Path(repo) / "feature_store.yaml").is_file():
        raise ConfigError(f"{where}: {repo} has no feature_store.yaml; name the Feast repo's folder")
    try:
        store = FeatureStore(repo_path=repo)
        store.list_feature_views()  # the registry is read here: a repo never applied fails now
    except Exception as exc:  # Feast raises many kinds for a repo that does not load
        why = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ConfigError(f"{where}: the Feast repo {repo} does not load ({type(exc).__name__}: {why})") from exc
    return store


class FeatureRefs:
    """Feature refs (``view:feature``) checked against a store's registry, with the entity key."""

    def __init__(
        self, store: Any, refs: Sequence[str], key: str, where: str = "source.features", service: str = ""
    ) -> None:
        if refs and service:
            raise ConfigError("source.feature_service: set it or source.features, not both")
        if service:
            refs, where = service_refs(store, service), f"source.feature_service ({service})"
        if not refs:
            raise ConfigError(f"{where}: name the features (['user_stats:clicks_7d', ...]) or a feature service")
        self.refs, self.key = list(refs), key
        self.views: dict[str, Any] = {}
        self.names: list[str] = []
        for ref in self.refs:
            self.names.append(self._check(store, ref, where))
        repeated = sorted({n for n in self.names if self.names.count(n) > 1})
        if repeated:
            raise ConfigError(f"{where}: two views give a feature named {repeated[0]!r}; keep one of them")

    def digest(self) -> str:
        """A digest of the definitions of the feature views read (their specs as the registry holds
        them): part of the job's identity, so a changed definition is another job."""
        h = hashlib.sha256()
        for name in sorted(self.views):
            h.update(name.encode())
            h.update(self.views[name].to_proto().spec.SerializeToString(deterministic=True))
        return h.hexdigest()[:16]

    def _check(self, store: Any, ref: str, where: str) -> str:
        from feast.errors import FeatureViewNotFoundException

        view, _, name = ref.partition(":")
        if not view or not name:
            raise ConfigError(f"{where}: {ref!r} is not a feature ref; write it as 'view:feature'")
        if view not in self.views:
            try:
                self.views[view] = store.get_feature_view(view)
            except FeatureViewNotFoundException:
                known = sorted(v.name for v in store.list_feature_views())
                raise ConfigError(
                    f"{where}: {ref!r}: Feast has no feature view {view!r} ({', '.join(known)})"
                ) from None
        fv = self.views[view]
        have = [f.name for f in fv.features]
        if name not in have:
            near = difflib.get_close_matches(name, have, n=1)
            hint = f"; did you mean {view}:{near[0]}?" if near else f" ({', '.join(have)})"
            raise ConfigError(f"{where}: {ref!r}: feature view {view!r} has no feature {name!r}{hint}")
        if self.key not in fv.join_keys:
            raise ConfigError(
                f"source.id_column: {self.key!r} is not feature view {view!r}'s entity key ({', '.join(fv.join_keys)})"
            )
        return name


def service_refs(store: Any, name: str) -> list[str]:
    """The refs of the features a feature service names (each view by its own name, not an alias)."""
    from feast.errors import FeatureServiceNotFoundException

    try:
        service = store.get_feature_service(name)
    except FeatureServiceNotFoundException:
        known = sorted(s.name for s in store.list_feature_services())
        raise ConfigError(
            f"source.feature_service: Feast has no feature service {name!r} ({', '.join(known)})"
        ) from None
    return [f"{view.name}:{f.name}" for view in service.feature_view_projections for f in view.features]


class _Reader:
    """Features of entity rows from one repo's store: ``setup`` opens it and checks the refs."""

    def __init__(self, repo: str, refs: Sequence[str], key: str, service: str = "") -> None:
        self.repo, self.refs, self.key, self.service = repo, list(refs), key, service
        self.store: Any = None
        self.checked: FeatureRefs | None = None

    def setup(self) -> list[str]:
        """Open the store and check the refs (a service's, resolved); the features' names, in order."""
        self.store = open_store(self.repo)
        self.checked = FeatureRefs(self.store, self.refs, self.key, service=self.service)
        self.refs = self.checked.refs
        return self.checked.names

    def digest(self) -> str:
        """The digest of the definitions of the views read (:meth:`FeatureRefs.digest`), once set up."""
        assert self.checked is not None, "setup() first"
        return self.checked.digest()


class HistoricalFeatures(_Reader):
    """Point-in-time features of entity rows (key, event time), in the rows' order, as Arrow columns."""

    def __init__(self, repo: str, refs: Sequence[str], key: str, timestamp: str, service: str = "") -> None:
        super().__init__(repo, refs, key, service)
        self.timestamp = timestamp
        self._lock = threading.Lock()  # one Feast call at a time: its store is not documented thread-safe

    def __call__(self, table: pa.Table) -> pa.Table:
        import pandas as pd
        import pytz

        assert self.checked is not None, "setup() first"
        # UTC as pytz names it: Feast's file store compares the zone with pytz.UTC and, for any other
        # (datetime.timezone.utc included), fixes every row's zone in Python (a third of a call's time)
        times = pd.to_datetime(table.column(self.timestamp).to_pandas(), utc=True).dt.tz_convert(pytz.UTC)
        entities = pd.DataFrame(
            {self.key: table.column(self.key).to_pandas(), "event_timestamp": times, POSITION: np.arange(len(times))}
        )
        with self._lock:
            found = self.store.get_historical_features(entity_df=entities, features=self.refs).to_df()
        found = found.sort_values(POSITION, kind="stable")
        return pa.Table.from_pandas(found[self.checked.names], preserve_index=False)


class OnlineFeatures(_Reader):
    """The latest features of entity keys from the online store, in the rows' order."""

    def __call__(self, table: pa.Table) -> pa.Table:
        assert self.checked is not None, "setup() first"
        rows = [{self.key: k} for k in table.column(self.key).to_pylist()]
        found = self.store.get_online_features(features=self.refs, entity_rows=rows).to_dict()
        return pa.table({n: pa.array(found[n]) for n in self.checked.names})
