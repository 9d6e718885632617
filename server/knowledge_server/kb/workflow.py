"""The knowledge base's rules: revision states and their transitions, optimistic locking,
four-eyes review, the tag dictionary, templates, feedback and releases.

Every operation is one write transaction of :class:`~knowledge_server.kb.store.KBStore`
that first checks everything it depends on (the expected versions, the state, the tags)
and then writes: a refusal changes nothing. The organisation is always ``who.organisation``.

Revision states and the only transitions (``TRANSITIONS``)::

    DRAFT -> REVIEWING                     submit (the revision has a source)
    REVIEWING -> APPROVED | DRAFT          approve (four-eyes) | return with a reason
    APPROVED | FAILED -> PROCESSING        the PROCESS task starts (a retry starts again)
    PROCESSING -> PROCESSED | FAILED       the task ends
    PROCESSED -> PUBLISHED                 publish (the topic's visible release)
    PUBLISHED -> SUPERSEDED                a newer revision of the topic is published
    PUBLISHED -> ROLLED_BACK | OFFLINE     rollback | offline
    SUPERSEDED -> PUBLISHED                rollback restores the release it replaced

``SUPERSEDED`` (a published revision replaced by a newer release, kept indexed so a
rollback can restore it at once) is the one state beyond the list of the issue.
Only a ``DRAFT`` is edited; a correction of anything else is a new draft.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import apsw

from knowledge_server.auth_model import Principal
from knowledge_server.errors import (
    DuplicateKey,
    IllegalTransition,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    StaleVersion,
    UnknownTag,
)
from knowledge_server.kb.store import (
    FeedbackRow,
    KBStore,
    RevisionRow,
    SourceRow,
    TagRow,
    TemplateRow,
    TopicRow,
    must,
    new_id,
    now,
)

__all__ = [
    "INDEXED_STATES",
    "STATES",
    "TRANSITIONS",
    "Workflow",
    "check_transition",
    "one_line_text",
]

STATES = (
    "DRAFT",
    "REVIEWING",
    "APPROVED",
    "PROCESSING",
    "PROCESSED",
    "FAILED",
    "PUBLISHED",
    "SUPERSEDED",
    "ROLLED_BACK",
    "OFFLINE",
)

TRANSITIONS: dict[str, frozenset[str]] = {
    "DRAFT": frozenset({"REVIEWING"}),
    "REVIEWING": frozenset({"APPROVED", "DRAFT"}),
    "APPROVED": frozenset({"PROCESSING"}),
    "PROCESSING": frozenset({"PROCESSED", "FAILED"}),
    "FAILED": frozenset({"PROCESSING"}),
    "PROCESSED": frozenset({"PUBLISHED"}),
    "PUBLISHED": frozenset({"SUPERSEDED", "ROLLED_BACK", "OFFLINE"}),
    "SUPERSEDED": frozenset({"PUBLISHED"}),
    "ROLLED_BACK": frozenset(),
    "OFFLINE": frozenset(),
}

# States whose chunks the retrieval index must hold (reconcile re-stages them when
# missing and drops every other revision's chunks).
INDEXED_STATES = ("PROCESSED", "PUBLISHED", "SUPERSEDED")

_CODE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_TEMPLATE_CODE = re.compile(r"^[A-Z0-9][A-Z0-9_]{0,63}$")
TEMPLATE_STATUSES = ("ACTIVE", "INACTIVE")


def check_transition(current: str, target: str, *, what: str = "revision") -> None:
    """Refuse a transition the state machine does not allow (``IllegalTransition``)."""
    if target not in TRANSITIONS.get(current, frozenset()):
        raise IllegalTransition(
            f"{what}: cannot go from {current} to {target}",
            metadata={"state": current, "target": target},
        )


def _stale(what: str, expected: int, current: int) -> StaleVersion:
    return StaleVersion(
        f"{what}: expected version {expected}, but it is at version {current}; read it again",
        metadata={"expected_version": str(expected), "current_version": str(current)},
    )


def _require_version(what: str, expected: int, current: int) -> None:
    if expected != current:
        raise _stale(what, expected, current)


# Characters a one-line name cannot hold: controls (line breaks among them), line and
# paragraph separators, and the bidi embeddings, overrides and isolates that reorder what a
# reader sees. Other format characters are text (Persian's zero-width non-joiner, an emoji
# sequence's joiner, a soft hyphen, Hebrew's right-to-left mark).
_NOT_ONE_LINE = frozenset({"Cc", "Zl", "Zp"})
_BIDI_CONTROLS = frozenset(chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A)))


def _text(
    name: str, value: str, *, required: bool = True, limit: int = 200, one_line: bool = False
) -> str:
    """``value`` stripped and checked. ``one_line``: a name shown as one line (a title, a
    label, a key) holds no line break, control or invisible format character: it is quoted
    in citations, prompts and listings, and must not start lines of its own there."""
    value = value.strip()
    if required and not value:
        raise InvalidRequest(f"{name}: required", metadata={"field": name})
    if len(value) > limit:
        raise InvalidRequest(f"{name}: longer than {limit} characters", metadata={"field": name})
    if one_line and not value.isprintable():
        bad = next(
            (c for c in value if unicodedata.category(c) in _NOT_ONE_LINE or c in _BIDI_CONTROLS),
            None,
        )
        if bad is not None:
            raise InvalidRequest(
                f"{name}: cannot contain U+{ord(bad):04X} (a {name} is one line of text)",
                metadata={"field": name},
            )
    return value


def one_line_text(name: str, value: str, limit: int = 255) -> str:
    """A required name shown on one line (a source's file name): ``_text`` with
    ``one_line``."""
    return _text(name, value, limit=limit, one_line=True)


@dataclass(frozen=True)
class Published:
    """What a publish, rollback or offline did: the topic's release before and after."""

    topic_id: str
    previous_revision_id: str
    revision_id: str
    changed: tuple[str, ...]  # revision ids whose state changed


class Workflow:
    """The knowledge base's write operations and checked reads, on one ``KBStore``."""

    def __init__(self, store: KBStore) -> None:
        self.store = store

    # -- lookups that answer NOT_FOUND for another organisation's ids ----------------------
    def topic(self, who: Principal, topic_id: str) -> TopicRow:
        row = self.store.topic(who.organisation, topic_id)
        if row is None:
            raise NotFound("topic not found", metadata={"field": "topic_id"})
        return row

    def revision(self, who: Principal, revision_id: str) -> RevisionRow:
        row = self.store.revision(who.organisation, revision_id)
        if row is None:
            raise NotFound("revision not found", metadata={"field": "revision_id"})
        return row

    def _draft(self, who: Principal, revision_id: str, expected_version: int) -> RevisionRow:
        rev = self.revision(who, revision_id)
        _require_version("revision", expected_version, rev.version)
        if rev.state != "DRAFT":
            raise IllegalTransition(
                f"revision: only a DRAFT is edited, this one is {rev.state}; a correction is a new draft",
                metadata={"state": rev.state},
            )
        return rev

    def _move(
        self,
        c: apsw.Connection,
        rev: RevisionRow,
        target: str,
        expected_version: int | None = None,
        **fields: object,
    ) -> RevisionRow:
        """Change ``rev``'s state (and ``fields``) if its version is still the expected
        one; inside the caller's transaction."""
        check_transition(rev.state, target)
        version = rev.version if expected_version is None else expected_version
        sets = "".join(f", {k} = ?" for k in fields)
        sql = f"UPDATE revisions SET state = ?, version = version + 1, updated_at = ?{sets} WHERE org = ? AND id = ? AND version = ? AND state = ?"  # noqa: S608 - column names are this module's keyword arguments; values are bound
        c.execute(sql, (target, now(), *fields.values(), rev.org, rev.id, version, rev.state))
        if c.changes() != 1:
            fresh = self.store.revision(rev.org, rev.id)
            raise _stale("revision", version, fresh.version if fresh else -1)
        return must(self.store.revision(rev.org, rev.id), "revision")

    def _bump(self, c: apsw.Connection, rev: RevisionRow, expected_version: int) -> None:
        c.execute(
            "UPDATE revisions SET version = version + 1, updated_at = ?"
            " WHERE org = ? AND id = ? AND version = ?",
            (now(), rev.org, rev.id, expected_version),
        )
        if c.changes() != 1:
            raise _stale("revision", expected_version, rev.version)

    # -- policy -----------------------------------------------------------------------------
    def set_policy(
        self, who: Principal, *, allow_self_approval: bool, expected_version: int
    ) -> tuple[bool, int]:
        org = who.organisation
        with self.store.tx() as c:
            _, version = self.store.policy(org)
            _require_version("policy", expected_version, version)
            c.execute(
                "INSERT INTO policy(org, allow_self_approval, version, updated_at) VALUES (?, ?, 1, ?)"
                " ON CONFLICT(org) DO UPDATE SET allow_self_approval = excluded.allow_self_approval,"
                " version = policy.version + 1, updated_at = excluded.updated_at",
                (org, int(allow_self_approval), now()),
            )
        return self.store.policy(org)

    # -- topics -----------------------------------------------------------------------------
    def create_topic(self, who: Principal, knowledge_key: str, title: str) -> TopicRow:
        key = _text("knowledge_key", knowledge_key, limit=128, one_line=True)
        title = _text("title", title, limit=300, one_line=True)
        org = who.organisation
        topic_id = new_id("top")
        stamp = now()
        with self.store.tx() as c:
            taken = c.execute(
                "SELECT 1 FROM topics WHERE org = ? AND knowledge_key = ?", (org, key)
            ).fetchone()
            if taken:
                raise DuplicateKey(
                    f"knowledge_key {key!r} is taken in this organisation",
                    metadata={"field": "knowledge_key"},
                )
            c.execute(
                "INSERT INTO topics(id, org, knowledge_key, title, version, created_by,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?)",
                (topic_id, org, key, title, who.id, stamp, stamp),
            )
        return self.topic(who, topic_id)

    # -- revisions ----------------------------------------------------------------------------
    def _checked_tags(self, org: str, tags: Sequence[str]) -> tuple[str, ...]:
        out: list[str] = []
        for code in dict.fromkeys(t.strip() for t in tags):
            row = self.store.tag(org, code)
            if row is None or not row.active:
                raise UnknownTag(
                    f"tag {code!r} is not an active tag of this organisation",
                    metadata={"field": "tags", "tag": code[:64]},
                )
            out.append(code)
        return tuple(out)

    def create_revision(
        self,
        who: Principal,
        topic_id: str,
        version_label: str,
        *,
        based_on: str = "",
        feedback_id: str = "",
    ) -> RevisionRow:
        """A new DRAFT of the topic; ``based_on`` copies that revision's sources and tags
        (a correction starts from what was published), which stays as it was."""
        label = _text("version_label", version_label, limit=64, one_line=True)
        topic = self.topic(who, topic_id)
        org = who.organisation
        base = self.revision(who, based_on) if based_on else None
        if base is not None and base.topic_id != topic.id:
            raise InvalidRequest(
                "based_on: the revision belongs to another topic", metadata={"field": "based_on"}
            )
        rev_id = new_id("rev")
        stamp = now()
        with self.store.tx() as c:
            c.execute(
                "INSERT INTO revisions(id, org, topic_id, version_label, state, version, tags,"
                " created_by, based_on, feedback_id, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 'DRAFT', 1, ?, ?, ?, ?, ?, ?)",
                (
                    rev_id,
                    org,
                    topic.id,
                    label,
                    json.dumps(list(base.tags) if base else []),
                    who.id,
                    based_on,
                    feedback_id,
                    stamp,
                    stamp,
                ),
            )
            if base is not None:
                for src in self.store.sources(org, base.id):
                    self._insert_source(c, org, rev_id, src.ordinal, src, stamp)
        return self.revision(who, rev_id)

    @staticmethod
    def _insert_source(
        c: apsw.Connection, org: str, rev_id: str, ordinal: int, src: SourceRow, stamp: str
    ) -> str:
        source_id = new_id("src")
        c.execute(
            "INSERT INTO sources(id, org, revision_id, ordinal, kind, file_name, media_type,"
            " sha256, size, question, answer, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                source_id,
                org,
                rev_id,
                ordinal,
                src.kind,
                src.file_name,
                src.media_type,
                src.sha256,
                src.size,
                src.question,
                src.answer,
                stamp,
            ),
        )
        return source_id

    def update_revision(
        self,
        who: Principal,
        revision_id: str,
        expected_version: int,
        *,
        version_label: str | None = None,
        tags: Sequence[str] | None = None,
    ) -> RevisionRow:
        with self.store.tx() as c:
            rev = self._draft(who, revision_id, expected_version)
            label = (
                _text("version_label", version_label, limit=64, one_line=True)
                if version_label is not None
                else rev.version_label
            )
            codes = self._checked_tags(rev.org, tags) if tags is not None else rev.tags
            c.execute(
                "UPDATE revisions SET version_label = ?, tags = ?, version = version + 1,"
                " updated_at = ? WHERE org = ? AND id = ? AND version = ?",
                (label, json.dumps(list(codes)), now(), rev.org, rev.id, expected_version),
            )
            if c.changes() != 1:
                raise _stale("revision", expected_version, rev.version)
        return self.revision(who, revision_id)

    def add_file_source(
        self,
        who: Principal,
        revision_id: str,
        expected_version: int,
        *,
        file_name: str,
        media_type: str,
        sha256: str,
        size: int,
    ) -> tuple[RevisionRow, SourceRow]:
        with self.store.tx() as c:
            rev = self._draft(who, revision_id, expected_version)
            ordinal = self._next_ordinal(c, rev)
            src = SourceRow(
                "",
                rev.org,
                rev.id,
                ordinal,
                "file",
                file_name,
                media_type,
                sha256,
                size,
                "",
                "",
                "",
            )
            source_id = self._insert_source(c, rev.org, rev.id, ordinal, src, now())
            self._bump(c, rev, expected_version)
        return self.revision(who, revision_id), self._source(who, revision_id, source_id)

    @staticmethod
    def _next_ordinal(c: apsw.Connection, rev: RevisionRow) -> int:
        row = c.execute(
            "SELECT COALESCE(MAX(ordinal), -1) + 1 FROM sources WHERE org = ? AND revision_id = ?",
            (rev.org, rev.id),
        ).fetchone()
        return int(row[0]) if row else 0

    def _source(self, who: Principal, revision_id: str, source_id: str) -> SourceRow:
        for src in self.store.sources(who.organisation, revision_id):
            if src.id == source_id:
                return src
        raise NotFound("source not found", metadata={"field": "source_id"})

    def put_faq(
        self,
        who: Principal,
        revision_id: str,
        expected_version: int,
        *,
        question: str,
        answer: str,
        source_id: str = "",
    ) -> tuple[RevisionRow, SourceRow]:
        """Add an FAQ entry, or replace the one ``source_id`` names (same ordinal)."""
        q = _text("question", question, limit=2000)
        a = _text("answer", answer, limit=20000)
        with self.store.tx() as c:
            rev = self._draft(who, revision_id, expected_version)
            stamp = now()
            if source_id:
                old = self._source(who, revision_id, source_id)
                if old.kind != "faq":
                    raise InvalidRequest(
                        "source_id: not an FAQ entry", metadata={"field": "source_id"}
                    )
                c.execute(
                    "UPDATE sources SET question = ?, answer = ? WHERE org = ? AND id = ?",
                    (q, a, rev.org, source_id),
                )
                new_source = source_id
            else:
                ordinal = self._next_ordinal(c, rev)
                src = SourceRow("", rev.org, rev.id, ordinal, "faq", "", "", "", 0, q, a, "")
                new_source = self._insert_source(c, rev.org, rev.id, ordinal, src, stamp)
            self._bump(c, rev, expected_version)
        return self.revision(who, revision_id), self._source(who, revision_id, new_source)

    def remove_source(
        self, who: Principal, revision_id: str, expected_version: int, source_id: str
    ) -> RevisionRow:
        with self.store.tx() as c:
            rev = self._draft(who, revision_id, expected_version)
            self._source(who, revision_id, source_id)
            c.execute(
                "DELETE FROM sources WHERE org = ? AND revision_id = ? AND id = ?",
                (rev.org, rev.id, source_id),
            )
            self._bump(c, rev, expected_version)
        return self.revision(who, revision_id)

    # -- review --------------------------------------------------------------------------------
    def submit(self, who: Principal, revision_id: str, expected_version: int) -> RevisionRow:
        with self.store.tx() as c:
            rev = self.revision(who, revision_id)
            _require_version("revision", expected_version, rev.version)
            check_transition(rev.state, "REVIEWING")
            if not self.store.sources(rev.org, rev.id):
                raise IllegalTransition(
                    "revision: submit needs at least one source (a file or an FAQ entry)",
                    metadata={"state": rev.state, "target": "REVIEWING"},
                )
            return self._move(
                c, rev, "REVIEWING", expected_version, submitted_by=who.id, return_reason=""
            )

    def approve(self, who: Principal, revision_id: str, expected_version: int) -> RevisionRow:
        with self.store.tx() as c:
            rev = self.revision(who, revision_id)
            _require_version("revision", expected_version, rev.version)
            check_transition(rev.state, "APPROVED")
            allow_self, _ = self.store.policy(rev.org)
            if rev.submitted_by == who.id and not allow_self:
                raise PermissionDenied(
                    "four-eyes review: the principal who submitted a revision cannot approve it"
                    " (the organisation's policy does not allow self-approval)"
                )
            return self._move(c, rev, "APPROVED", expected_version, reviewed_by=who.id)

    def return_to_draft(
        self, who: Principal, revision_id: str, expected_version: int, reason: str
    ) -> RevisionRow:
        why = _text("reason", reason, limit=2000)
        with self.store.tx() as c:
            rev = self.revision(who, revision_id)
            _require_version("revision", expected_version, rev.version)
            return self._move(
                c, rev, "DRAFT", expected_version, reviewed_by=who.id, return_reason=why
            )

    # -- releases ------------------------------------------------------------------------------
    def _expect_release(self, org: str, topic_id: str, expected: str) -> str:
        current = self.store.release(org, topic_id)
        if current != expected:
            raise StaleVersion(
                f"release: the topic's current release is {current or 'none'}, not"
                f" {expected or 'none'}; read it again",
                metadata={"expected_release": expected, "current_release": current},
            )
        return current

    def _set_release(
        self, c: apsw.Connection, who: Principal, topic_id: str, rev_id: str, prev: str, action: str
    ) -> None:
        stamp = now()
        c.execute(
            "INSERT INTO releases(org, topic_id, revision_id, updated_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT(org, topic_id) DO UPDATE SET revision_id = excluded.revision_id,"
            " updated_at = excluded.updated_at",
            (who.organisation, topic_id, rev_id, stamp),
        )
        c.execute(
            "INSERT INTO release_history(org, topic_id, revision_id, previous_id, action,"
            " principal, at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (who.organisation, topic_id, rev_id, prev, action, who.id, stamp),
        )

    def publish(
        self, who: Principal, revision_id: str, expected_version: int, expected_release: str
    ) -> Published:
        """One transaction: the revision becomes the topic's release and the previous one
        SUPERSEDED. Readers see the previous release until the commit, then this one."""
        with self.store.tx() as c:
            rev = self.revision(who, revision_id)
            _require_version("revision", expected_version, rev.version)
            if rev.state != "PROCESSED":
                # SUPERSEDED -> PUBLISHED is a rollback's, never a publish's.
                raise IllegalTransition(
                    f"revision: only a PROCESSED revision is published, this one is {rev.state}",
                    metadata={"state": rev.state, "target": "PUBLISHED"},
                )
            prev = self._expect_release(rev.org, rev.topic_id, expected_release)
            changed = [rev.id]
            if prev:
                old = self.revision(who, prev)
                self._move(c, old, "SUPERSEDED")
                changed.append(old.id)
            self._move(c, rev, "PUBLISHED", expected_version)
            self._set_release(c, who, rev.topic_id, rev.id, prev, "publish")
        return Published(rev.topic_id, prev, rev.id, tuple(changed))

    def rollback(self, who: Principal, topic_id: str, expected_release: str) -> Published:
        """The current release becomes ROLLED_BACK and the release its publishing replaced
        (still SUPERSEDED) is published again. A release published after the topic was
        taken offline replaced nothing: there is nothing to restore (an older revision the
        operator retired is not brought back by it)."""
        topic = self.topic(who, topic_id)
        with self.store.tx() as c:
            current = self._expect_release(topic.org, topic.id, expected_release)
            if not current:
                raise IllegalTransition(
                    "release: the topic has no release to roll back",
                    metadata={"state": "", "target": "ROLLED_BACK"},
                )
            # What the current release's publishing replaced (a release restored by an
            # earlier rollback keeps what its own publishing replaced).
            replaced = next(
                (
                    prev
                    for rev_id, prev, action, _who, _at in reversed(
                        self.store.release_history(topic.org, topic.id)
                    )
                    if rev_id == current and action == "publish"
                ),
                "",
            )
            cand = self.store.revision(topic.org, replaced) if replaced else None
            restore = cand.id if cand is not None and cand.state == "SUPERSEDED" else ""
            if not restore:
                raise IllegalTransition(
                    "release: no earlier release of this topic to restore; take it offline instead",
                    metadata={"state": "PUBLISHED", "target": "ROLLED_BACK"},
                )
            cur = self.revision(who, current)
            self._move(c, cur, "ROLLED_BACK")
            self._move(c, self.revision(who, restore), "PUBLISHED")
            self._set_release(c, who, topic.id, restore, current, "rollback")
        return Published(topic.id, current, restore, (current, restore))

    def offline(self, who: Principal, topic_id: str, expected_release: str) -> Published:
        topic = self.topic(who, topic_id)
        with self.store.tx() as c:
            current = self._expect_release(topic.org, topic.id, expected_release)
            if not current:
                raise IllegalTransition(
                    "release: the topic has no release to take offline",
                    metadata={"state": "", "target": "OFFLINE"},
                )
            self._move(c, self.revision(who, current), "OFFLINE")
            self._set_release(c, who, topic.id, "", current, "offline")
        return Published(topic.id, current, "", (current,))

    # -- tags ------------------------------------------------------------------------------------
    def create_tag(
        self, who: Principal, code: str, display_name: str, sort_order: int = 0
    ) -> TagRow:
        code = code.strip()
        if not _CODE.match(code):
            raise InvalidRequest(
                "tag_code: 1-64 characters of a-z, 0-9, '_', '.', '-', starting with a letter or digit",
                metadata={"field": "tag_code"},
            )
        name = _text("display_name", display_name, limit=120, one_line=True)
        stamp = now()
        with self.store.tx() as c:
            if self.store.tag(who.organisation, code) is not None:
                raise DuplicateKey(
                    f"tag_code {code!r} exists in this organisation (codes are never reused)",
                    metadata={"field": "tag_code"},
                )
            c.execute(
                "INSERT INTO tags(org, code, display_name, sort_order, active, version,"
                " created_at, updated_at) VALUES (?, ?, ?, ?, 1, 1, ?, ?)",
                (who.organisation, code, name, sort_order, stamp, stamp),
            )
        return must(self.store.tag(who.organisation, code), "tag")

    def update_tag(
        self,
        who: Principal,
        code: str,
        expected_version: int,
        *,
        display_name: str | None = None,
        sort_order: int | None = None,
        active: bool | None = None,
    ) -> TagRow:
        """Display name, order and activity change; the code is frozen, and revisions
        keep the codes they recorded (a rename or a deactivation rewrites none)."""
        with self.store.tx() as c:
            tag = self.store.tag(who.organisation, code)
            if tag is None:
                raise NotFound("tag not found", metadata={"field": "tag_code"})
            _require_version("tag", expected_version, tag.version)
            name = (
                _text("display_name", display_name, limit=120, one_line=True)
                if display_name is not None
                else tag.display_name
            )
            c.execute(
                "UPDATE tags SET display_name = ?, sort_order = ?, active = ?,"
                " version = version + 1, updated_at = ?"
                " WHERE org = ? AND code = ? AND version = ?",
                (
                    name,
                    tag.sort_order if sort_order is None else sort_order,
                    int(tag.active if active is None else active),
                    now(),
                    who.organisation,
                    code,
                    expected_version,
                ),
            )
        return must(self.store.tag(who.organisation, code), "tag")

    # -- templates -------------------------------------------------------------------------------
    def put_template(
        self, who: Principal, code: str, body: str, status: str, expected_version: int
    ) -> TemplateRow:
        """Create (``expected_version`` 0) or update an answer template. ``DEFAULT`` is
        the one used when a request names none; it can be edited but not deactivated."""
        code = code.strip()
        if not _TEMPLATE_CODE.match(code):
            raise InvalidRequest(
                "template_code: 1-64 characters of A-Z, 0-9 and '_'",
                metadata={"field": "template_code"},
            )
        text = _text("body", body, limit=20000)
        status = status or "ACTIVE"
        if status not in TEMPLATE_STATUSES:
            raise InvalidRequest("status: ACTIVE or INACTIVE", metadata={"field": "status"})
        if code == "DEFAULT" and status != "ACTIVE":
            raise InvalidRequest(
                "status: the DEFAULT template stays ACTIVE", metadata={"field": "status"}
            )
        with self.store.tx() as c:
            old = self.store.template(who.organisation, code)
            _require_version("template", expected_version, old.version if old else 0)
            c.execute(
                "INSERT INTO templates(org, code, body, status, version, updated_by, updated_at)"
                " VALUES (?, ?, ?, ?, 1, ?, ?) ON CONFLICT(org, code) DO UPDATE SET"
                " body = excluded.body, status = excluded.status, version = templates.version + 1,"
                " updated_by = excluded.updated_by, updated_at = excluded.updated_at",
                (who.organisation, code, text, status, who.id, now()),
            )
        return must(self.store.template(who.organisation, code), "template")

    # -- feedback --------------------------------------------------------------------------------
    def create_feedback(
        self, who: Principal, topic_id: str, body: str, revision_id: str = ""
    ) -> FeedbackRow:
        topic = self.topic(who, topic_id)
        if revision_id and self.revision(who, revision_id).topic_id != topic.id:
            raise InvalidRequest(
                "revision_id: the revision belongs to another topic",
                metadata={"field": "revision_id"},
            )
        text = _text("body", body, limit=20000)
        fb_id = new_id("fb")
        stamp = now()
        with self.store.tx() as c:
            c.execute(
                "INSERT INTO feedback(id, org, topic_id, revision_id, body, status, version,"
                " created_by, created_at, updated_at) VALUES (?, ?, ?, ?, ?, 'OPEN', 1, ?, ?, ?)",
                (fb_id, who.organisation, topic.id, revision_id, text, who.id, stamp, stamp),
            )
        return must(self.store.feedback_item(who.organisation, fb_id), "feedback")

    def resolve_feedback(
        self,
        who: Principal,
        feedback_id: str,
        expected_version: int,
        *,
        create_draft: bool,
        version_label: str = "",
    ) -> tuple[FeedbackRow, RevisionRow | None]:
        """Close a feedback item; with ``create_draft`` it becomes a new DRAFT of its
        topic, based on the topic's current release (the release itself is untouched)."""
        org = who.organisation
        with self.store.tx() as c:
            fb = self.store.feedback_item(org, feedback_id)
            if fb is None:
                raise NotFound("feedback not found", metadata={"field": "feedback_id"})
            _require_version("feedback", expected_version, fb.version)
            if fb.status != "OPEN":
                raise IllegalTransition(
                    f"feedback: already {fb.status}",
                    metadata={"state": fb.status, "target": "RESOLVED"},
                )
            draft = None
            if create_draft:
                base = self.store.release(org, fb.topic_id)
                draft = self.create_revision(
                    who,
                    fb.topic_id,
                    version_label or "draft",
                    based_on=base,
                    feedback_id=fb.id,
                )
            c.execute(
                "UPDATE feedback SET status = ?, draft_revision_id = ?, version = version + 1,"
                " updated_at = ? WHERE org = ? AND id = ? AND version = ?",
                (
                    "DRAFTED" if draft else "RESOLVED",
                    draft.id if draft else "",
                    now(),
                    org,
                    fb.id,
                    expected_version,
                ),
            )
        return must(self.store.feedback_item(org, feedback_id), "feedback"), draft
