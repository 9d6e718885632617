"""Opening the configured knowledge-base retrieval index (``kb.index.factory``)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from knowledge_server.kb.index.factory import MILVUS_LITE_FILE, IndexSettings, open_index
from knowledge_server.kb.index.milvus import MilvusRetrievalIndex
from knowledge_server.kb.index.port import IndexChunk
from knowledge_server.kb.index.sqlite import STORE_FILE, SqliteRetrievalIndex


def _row(org: str) -> IndexChunk:
    return IndexChunk("r1:0", org, "t", "r1", "s", 0, "text", "T", (), None, "refund text", ())


@pytest.mark.parametrize("backend", ["sqlite", "milvus"])
def test_default_locations_in_the_data_directory(tmp_path: Path, backend: str) -> None:
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    index = open_index(tmp_path / "data", 4, IndexSettings(backend=backend))
    try:
        expected = SqliteRetrievalIndex if backend == "sqlite" else MilvusRetrievalIndex
        assert isinstance(index, expected)
        index.stage("acme", "r1", [_row("acme")], [[1.0, 0.0, 0.0, 0.0]])
        assert index.revision_counts() == {("acme", "r1"): 1}
    finally:
        index.close()
    name = STORE_FILE if backend == "sqlite" else MILVUS_LITE_FILE
    assert (tmp_path / "data" / name).exists()


def test_settings_are_checked_and_describe_hides_credentials() -> None:
    with pytest.raises(ValueError, match="backend"):
        IndexSettings(backend="elastic")
    with pytest.raises(ValueError, match="timeout"):
        IndexSettings(backend="milvus", milvus_timeout_s=0)
    shown = IndexSettings(
        backend="milvus", milvus_uri="https://root:s3cret@milvus.internal:19530"
    ).describe()
    assert "s3cret" not in shown and "milvus.internal:19530" in shown
    assert IndexSettings().describe() == f"sqlite ({STORE_FILE})"


def test_the_configuration_names_the_index_and_the_token_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from knowledge_server.config import ConfigError, load_config
    from knowledge_server.runtime import kb_index_settings

    monkeypatch.setenv("KB_MILVUS_TOKEN", "user:secret")
    cfg = load_config(
        env={},
        overrides={
            "data_dir": str(tmp_path),
            "kb_index": "milvus",
            "kb_milvus_uri": "http://milvus.internal:19530",
            "kb_milvus_token_env": "KB_MILVUS_TOKEN",
        },
    )
    settings = kb_index_settings(cfg)
    assert (settings.backend, settings.milvus_uri, settings.milvus_token) == (
        "milvus",
        "http://milvus.internal:19530",
        "user:secret",
    )
    assert "secret" not in settings.describe()
    assert (
        kb_index_settings(load_config(env={}, overrides={"data_dir": str(tmp_path)})).backend
        == "sqlite"
    )
    with pytest.raises(ConfigError, match="kb_index"):
        load_config(env={}, overrides={"data_dir": str(tmp_path), "kb_index": "elastic"})
