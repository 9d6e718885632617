"""A principal whose scope is a sub-folder of an indexed workspace, over a real server.

ISO-2 / ISO-5: a search filters the code lane by workspace root, so a scope inside an
indexed root (``/mono/team-a`` of ``/mono``) finds none of that root; GetChunk and
GetStatus show no more than a search does: a chunk of the root answers exactly as an
unknown id, and the root is neither named nor counted."""

from __future__ import annotations

from pathlib import Path

import pytest
from knowledge_sdk import AsyncKnowledgeClient, NotFound
from knowledge_server.auth import TokenStore

from tests.conftest import start_server

CANARY_B = "chargecardcanary"


async def test_iso2_iso5_a_subfolder_scope_sees_nothing_of_its_parent_root(
    tmp_path: Path,
) -> None:
    mono = tmp_path / "mono"
    (mono / "team-a").mkdir(parents=True)
    (mono / "team-b").mkdir()
    (mono / "team-a" / "alpha.py").write_text("def alpha_handler():\n    return 1\n")
    (mono / "team-b" / "billing.py").write_text(
        f"def {CANARY_B}():\n    return 'team-b internal logic'\n"
    )
    tokens = TokenStore(tmp_path / "data" / "tokens.json")
    _, admin = tokens.create("admin", "org", None, "operator")
    _, agent = tokens.create("agent-a", "org", [str(mono / "team-a")], "agent")
    rs = await start_server(tmp_path, authenticate=tokens.authenticate, auth="on")
    try:
        async with AsyncKnowledgeClient(rs.address, token=admin) as kc:
            events = [ev async for ev in kc.index_workspace(str(mono))]
            assert events[-1].summary is not None
            found = await kc.search(CANARY_B, include=["code"])
            ids = {i.path: i.id for i in found.lanes.code.items}
            assert "team-b/billing.py" in ids
            own = await kc.search("alpha_handler", include=["code"])
            ids.update({i.path: i.id for i in own.lanes.code.items})
            assert "team-a/alpha.py" in ids
        async with AsyncKnowledgeClient(rs.address, token=agent) as kc:
            resp = await kc.search(f"{CANARY_B} alpha_handler", include=["code"])
            assert not resp.lanes.code.items
            for path in ("team-b/billing.py", "team-a/alpha.py"):
                cid = ids[path]
                unknown = cid[:-4] + ("0000" if not cid.endswith("0000") else "1111")
                with pytest.raises(NotFound) as theirs:
                    await kc.get_chunk(cid)
                with pytest.raises(NotFound) as nobody:
                    await kc.get_chunk(unknown)
                assert (theirs.value.reason, theirs.value.message) == (
                    nobody.value.reason,
                    nobody.value.message,
                )
            status = await kc.get_status()
            code = next(lane for lane in status.lanes if lane.lane == "code")
            assert str(mono) not in code.index_rev
            assert code.counts.get("workspaces", 0) == 0
            assert code.counts.get("chunks", 0) == 0 and code.counts.get("files", 0) == 0
    finally:
        await rs.server.stop(0)
