"""``KnowledgeBaseAdminService`` in the application layer: each RPC's request, checked and
turned into a call of the workflow or the queue (in a thread), its answer as protobuf, and
the audit event of every write.

The organisation is ``principal.organisation`` everywhere; no request field names one.
Every write appends one audit event (``kb.<op>``) with the ids it touched and the hash of
its input, also when it is refused (the outcome is then the reason code). Uploaded bytes
and FAQ text are never in an event: an upload's input is its size and digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import json_format
from google.protobuf.message import Message

from knowledge_server import deadline
from knowledge_server._gen.knowledge.v1 import kb_admin_pb2 as pb
from knowledge_server.auth_model import Principal
from knowledge_server.errors import (
    DeadlineExceeded,
    IllegalTransition,
    InvalidRequest,
    KnowledgeError,
    NotFound,
    SourceTooLarge,
    StaleVersion,
    UnsupportedSource,
    as_storage_full,
)
from knowledge_server.kb import pipeline
from knowledge_server.kb.service import KnowledgeBase, ReconcileReport
from knowledge_server.kb.store import (
    FeedbackRow,
    RevisionRow,
    SourceRow,
    TagRow,
    TaskRow,
    TemplateRow,
    TopicRow,
    new_id,
    now,
)
from knowledge_server.kb.tasks import TERMINAL
from knowledge_server.kb.workflow import Published, one_line_text

__all__ = ["CHUNK_BYTES", "KnowledgeBaseAdmin", "Recorder"]

# Largest piece of one UploadSource call.
CHUNK_BYTES = 1024 * 1024
# How often WatchTask looks at the task (it may run in another serving process).
WATCH_SECONDS = 0.2


class Recorder(Protocol):
    def __call__(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str = "ok",
    ) -> Awaitable[object]: ...


class Appender(Protocol):
    """Appends one audit event in the calling thread (``KnowledgeApp.append_event``; the
    ``append_failure`` form logs an event it cannot write instead of raising)."""

    def __call__(
        self,
        principal: Principal,
        operation: str,
        *,
        targets: tuple[str, ...] | list[str] = (),
        input: object = None,
        outcome: str,
    ) -> object: ...


# -- rows as messages ---------------------------------------------------------------------


def topic_pb(row: TopicRow, release: str = "") -> pb.KbTopic:
    return pb.KbTopic(
        id=row.id,
        knowledge_key=row.knowledge_key,
        title=row.title,
        version=row.version,
        created_by=row.created_by,
        created_at=row.created_at,
        release_revision_id=release,
    )


def revision_pb(row: RevisionRow) -> pb.KbRevision:
    return pb.KbRevision(
        id=row.id,
        topic_id=row.topic_id,
        version_label=row.version_label,
        state=row.state,
        version=row.version,
        tags=list(row.tags),
        created_by=row.created_by,
        submitted_by=row.submitted_by,
        reviewed_by=row.reviewed_by,
        return_reason=row.return_reason,
        based_on=row.based_on,
        feedback_id=row.feedback_id,
        chunk_count=row.chunk_count,
        embed_model=row.embed_model,
        failure=row.failure,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def source_pb(row: SourceRow) -> pb.KbSource:
    return pb.KbSource(
        id=row.id,
        ordinal=row.ordinal,
        kind=row.kind,
        file_name=row.file_name,
        media_type=row.media_type,
        sha256=row.sha256,
        size=row.size,
        question=row.question,
        answer=row.answer,
    )


def tag_pb(row: TagRow) -> pb.KbTag:
    return pb.KbTag(
        tag_code=row.code,
        display_name=row.display_name,
        sort_order=row.sort_order,
        active=row.active,
        version=row.version,
    )


def template_pb(row: TemplateRow) -> pb.KbTemplate:
    return pb.KbTemplate(
        template_code=row.code,
        body=row.body,
        status=row.status,
        version=row.version,
        updated_by=row.updated_by,
        updated_at=row.updated_at,
    )


def feedback_pb(row: FeedbackRow) -> pb.KbFeedback:
    return pb.KbFeedback(
        id=row.id,
        topic_id=row.topic_id,
        revision_id=row.revision_id,
        body=row.body,
        status=row.status,
        draft_revision_id=row.draft_revision_id,
        version=row.version,
        created_by=row.created_by,
        created_at=row.created_at,
    )


def task_pb(row: TaskRow) -> pb.KbTask:
    return pb.KbTask(
        id=row.id,
        revision_id=row.revision_id,
        kind=row.kind,
        idempotency_key=row.idempotency_key,
        state=row.state,
        step=row.step,
        done=row.done,
        total=row.total,
        chunks=row.chunks,
        attempts=row.attempts,
        error_category=row.error_category,
        error_message=row.error_message,
        version=row.version,
        created_by=row.created_by,
        created_at=row.created_at,
        updated_at=row.updated_at,
        secrets_redacted=row.secrets_redacted,
    )


def release_pb(p: Published) -> pb.KbRelease:
    return pb.KbRelease(
        topic_id=p.topic_id, previous_revision_id=p.previous_revision_id, revision_id=p.revision_id
    )


def reconcile_pb(r: ReconcileReport) -> pb.ReconcileResponse:
    return pb.ReconcileResponse(
        checked=r.checked,
        dropped=r.dropped,
        requeued=r.requeued,
        already_queued=r.already_queued,
    )


@dataclass(frozen=True)
class Audit:
    """The audit event of a write: ``kb.<operation>``, the ids it touched, its input."""

    operation: str
    targets: tuple[str, ...]
    input: object


Op = Callable[[Any, Principal], tuple[Message, Audit | None]]

# Which request field names what a refused write was about (its audit targets).
_TARGET_FIELDS = ("revision_id", "topic_id", "task_id", "feedback_id", "tag_code", "template_code")


def _targets(req: Message) -> list[str]:
    """The ids a request names (what a failed write's audit event points at)."""
    return [
        str(getattr(req, f))
        for f in _TARGET_FIELDS
        if f in req.DESCRIPTOR.fields_by_name and getattr(req, f)
    ]


def _audit_input(req: Message) -> object:
    if isinstance(req, pb.UploadSourceRequest):
        return {
            "revision_id": req.revision_id,
            "upload_id": req.upload_id,
            "file_name": req.file_name,
            "offset": req.offset,
            "size": len(req.data),
            "sha256": hashlib.sha256(req.data).hexdigest(),
            "final": req.final,
        }
    return json_format.MessageToDict(req, preserving_proto_field_name=True)


class KnowledgeBaseAdmin:
    """The admin RPCs over one :class:`KnowledgeBase`; ``record`` appends audit events."""

    def __init__(
        self, kb: KnowledgeBase, record: Recorder, append: Appender, append_failure: Appender
    ) -> None:
        self.kb = kb
        self.record = record
        self.append = append
        self.append_failure = append_failure
        self.wf = kb.workflow
        self.queue = kb.queue
        self.ops: dict[str, Op] = {
            "CreateTopic": self._create_topic,
            "ListTopics": self._list_topics,
            "GetTopic": self._get_topic,
            "CreateRevision": self._create_revision,
            "GetRevision": self._get_revision,
            "UpdateRevision": self._update_revision,
            "UploadSource": self._upload_source,
            "PutFaq": self._put_faq,
            "RemoveSource": self._remove_source,
            "SubmitRevision": self._submit,
            "ApproveRevision": self._approve,
            "ReturnRevision": self._return,
            "ProcessRevision": self._process,
            "RetryTask": self._retry,
            "CancelTask": self._cancel,
            "PublishRevision": self._publish,
            "RollbackTopic": self._rollback,
            "OfflineTopic": self._offline,
            "Reconcile": self._reconcile,
            "CreateTag": self._create_tag,
            "UpdateTag": self._update_tag,
            "ListTags": self._list_tags,
            "PutTemplate": self._put_template,
            "ListTemplates": self._list_templates,
            "CreateFeedback": self._create_feedback,
            "ListFeedback": self._list_feedback,
            "ResolveFeedback": self._resolve_feedback,
            "GetPolicy": self._get_policy,
            "SetPolicy": self._set_policy,
        }
        self.writes = frozenset(
            name
            for name in self.ops
            if not name.startswith(("List", "Get"))  # reads: List*, Get*
        )

    async def call(self, op: str, req: Message, principal: Principal) -> Message:
        """Run ``op`` in the knowledge-base pool; a write is audited by the thread that runs
        it, as soon as it ends: one that outlives its caller (deadline passed, call
        cancelled) still commits, and is recorded as it ended, not as the caller's error
        nor not at all."""
        self.kb.worker.start()  # on this loop, once: the queue is served where RPCs are
        write = op in self.writes
        began = deadline.BeganGate()

        def run() -> Message:
            if write and not began.begin():
                raise DeadlineExceeded(deadline.MESSAGE)
            try:
                resp, audit = self.ops[op](req, principal)
            except Exception as exc:
                full = as_storage_full(exc)  # SQLITE_FULL, ENOSPC: not an internal error
                err = full if full is not None and not isinstance(exc, KnowledgeError) else exc
                if write:
                    reason = err.reason if isinstance(err, KnowledgeError) else "KNOWLEDGE_INTERNAL"
                    self.append_failure(
                        principal,
                        _operation(op),
                        targets=_targets(req),
                        input=_audit_input(req),
                        outcome=reason,
                    )
                if err is exc:
                    raise
                raise err from None
            if audit is not None:
                self.append(
                    principal,
                    audit.operation,
                    targets=audit.targets,
                    input=audit.input,
                    outcome="ok",
                )
            return resp

        try:
            resp = await deadline.off_loop(run, pool="kb")
        except KnowledgeError as err:
            if write and began.abandon():  # never began: the caller's side records it
                await self.record(
                    principal,
                    _operation(op),
                    targets=_targets(req),
                    input=_audit_input(req),
                    outcome=err.reason,
                )
            raise
        if op in ("ProcessRevision", "RetryTask"):
            self.kb.worker.wake()
        return resp

    async def watch(
        self, req: pb.WatchTaskRequest, principal: Principal
    ) -> AsyncIterator[pb.WatchTaskResponse]:
        """The task each time it changes, until it has ended (SUCCEEDED, FAILED,
        CANCELLED). It may run in another serving process: the store is what is watched."""
        self.kb.worker.start()
        if not req.task_id:
            raise InvalidRequest("task_id: required", metadata={"field": "task_id"})
        last: tuple[object, ...] | None = None
        while True:
            task = await asyncio.to_thread(self.queue.get, principal, req.task_id)
            seen = (task.state, task.step, task.done, task.total, task.chunks, task.version)
            if seen != last:
                last = seen
                yield pb.WatchTaskResponse(task=task_pb(task))
            if task.state in TERMINAL:
                return
            await asyncio.sleep(WATCH_SECONDS)

    # -- topics and revisions ------------------------------------------------------------
    def _create_topic(
        self, req: pb.CreateTopicRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        topic = self.wf.create_topic(who, req.knowledge_key, req.title)
        return pb.CreateTopicResponse(topic=topic_pb(topic)), Audit(
            "kb.topic.create", (topic.id,), _audit_input(req)
        )

    def _list_topics(self, req: pb.ListTopicsRequest, who: Principal) -> tuple[Message, None]:
        limit = req.limit or 100
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit: 1 to 1000", metadata={"field": "limit"})
        rows = self.kb.store.topics(who.organisation, after=req.after, limit=limit)
        out = pb.ListTopicsResponse(
            topics=[topic_pb(t, self.kb.store.release(who.organisation, t.id)) for t in rows]
        )
        return out, None

    def _get_topic(self, req: pb.GetTopicRequest, who: Principal) -> tuple[Message, None]:
        topic = self.wf.topic(who, req.topic_id)
        org = who.organisation
        out = pb.GetTopicResponse(
            topic=topic_pb(topic, self.kb.store.release(org, topic.id)),
            revisions=[revision_pb(r) for r in self.kb.store.revisions(org, topic.id)],
            history=[
                pb.KbReleaseEvent(
                    revision_id=a, previous_revision_id=b, action=c, principal=d, at=e
                )
                for a, b, c, d, e in self.kb.store.release_history(org, topic.id)
            ],
        )
        return out, None

    def _create_revision(
        self, req: pb.CreateRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.create_revision(who, req.topic_id, req.version_label, based_on=req.based_on)
        return pb.CreateRevisionResponse(revision=revision_pb(rev)), Audit(
            "kb.revision.create", (rev.id, rev.topic_id), _audit_input(req)
        )

    def _get_revision(self, req: pb.GetRevisionRequest, who: Principal) -> tuple[Message, None]:
        rev = self.wf.revision(who, req.revision_id)
        org = who.organisation
        out = pb.GetRevisionResponse(
            revision=revision_pb(rev),
            sources=[source_pb(s) for s in self.kb.store.sources(org, rev.id)],
            tasks=[task_pb(t) for t in self.kb.store.tasks_of(org, rev.id)],
        )
        return out, None

    def _update_revision(
        self, req: pb.UpdateRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.update_revision(
            who,
            req.revision_id,
            req.expected_version,
            version_label=req.version_label if req.HasField("version_label") else None,
            tags=list(req.tags) if req.replace_tags else None,
        )
        return pb.UpdateRevisionResponse(revision=revision_pb(rev)), Audit(
            "kb.revision.update", (rev.id,), _audit_input(req)
        )

    def _upload_source(
        self, req: pb.UploadSourceRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        """One piece of an upload (see the proto). The pieces go to a part file named by
        the upload's random id; the final piece moves it under its digest and adds the
        source to the DRAFT (checked against ``expected_version``) in one transaction."""
        org = who.organisation
        store = self.kb.store
        if len(req.data) > CHUNK_BYTES:
            raise InvalidRequest(
                f"data: a piece holds at most {CHUNK_BYTES} bytes",
                metadata={"field": "data", "limit": str(CHUNK_BYTES)},
            )
        rev = self.wf.revision(who, req.revision_id)
        if rev.state != "DRAFT":
            raise IllegalTransition(
                f"revision: sources are added to a DRAFT, this one is {rev.state}",
                metadata={"state": rev.state},
            )
        if not req.upload_id:
            # Shown in listings, citations and prompts as one line: no line break or
            # control character, as titles.
            name = one_line_text("file_name", os.path.basename(req.file_name.strip()))
            docling = self.kb.converter.docling is not None
            media = pipeline.media_type_of(name, req.media_type, docling=docling)
            if media is None:
                table = {**pipeline.SUPPORTED, **(pipeline.DOCLING_ONLY if docling else {})}
                supported = ", ".join(sorted(table))
                raise UnsupportedSource(
                    f"file_name: no converter for this type of file (supported: {supported})",
                    metadata={"field": "file_name"},
                )
            if req.offset != 0:
                raise InvalidRequest(
                    "offset: a new upload starts at 0", metadata={"field": "offset"}
                )
            upload_id = new_id("up")
            with store.tx() as c:
                c.execute(
                    "INSERT INTO uploads(id, org, revision_id, file_name, media_type, received,"
                    " created_by, created_at) VALUES (?, ?, ?, ?, ?, 0, ?, ?)",
                    (upload_id, org, rev.id, name, media, who.id, now()),
                )
            received = 0
        else:
            upload_id = req.upload_id
            with store.read() as c:
                row = c.execute(
                    "SELECT received FROM uploads WHERE org = ? AND id = ? AND revision_id = ?",
                    (org, upload_id, rev.id),
                ).fetchone()
            if row is None:
                raise NotFound("upload not found", metadata={"field": "upload_id"})
            received = int(row[0])
        if req.offset != received:
            raise InvalidRequest(
                f"offset: the upload has {received} bytes, not {req.offset}",
                metadata={"field": "offset", "received": str(received)},
            )
        if received + len(req.data) > self.kb.max_source_bytes:
            self._drop_upload(org, upload_id)
            raise SourceTooLarge(
                f"data: a source file holds at most {self.kb.max_source_bytes} bytes; the upload"
                " is discarded",
                metadata={"field": "data", "limit": str(self.kb.max_source_bytes)},
            )
        if req.final and req.expected_version != rev.version:
            # Checked before the piece is written, so the same final piece can be sent
            # again with the right version.
            raise StaleVersion(
                f"revision: expected version {req.expected_version}, but it is at version"
                f" {rev.version}; read it again",
                metadata={
                    "expected_version": str(req.expected_version),
                    "current_version": str(rev.version),
                },
            )
        part = store.upload_part(upload_id)
        part.parent.mkdir(parents=True, exist_ok=True)
        with part.open("r+b" if part.exists() else "wb") as fh:
            fh.seek(received)
            fh.write(req.data)
            fh.truncate()
        received += len(req.data)
        with store.tx() as c:
            c.execute(
                "UPDATE uploads SET received = ? WHERE org = ? AND id = ?",
                (received, org, upload_id),
            )
        if not req.final:
            return pb.UploadSourceResponse(upload_id=upload_id, received=received), None
        with store.read() as c:
            meta = c.execute(
                "SELECT file_name, media_type FROM uploads WHERE org = ? AND id = ?",
                (org, upload_id),
            ).fetchone()
        if meta is None:
            raise NotFound("upload not found", metadata={"field": "upload_id"})
        sha, size = store.keep_blob(part)
        rev, src = self.wf.add_file_source(
            who,
            rev.id,
            req.expected_version,
            file_name=str(meta[0]),
            media_type=str(meta[1]),
            sha256=sha,
            size=size,
        )
        self._drop_upload(org, upload_id)
        out = pb.UploadSourceResponse(
            upload_id=upload_id, received=received, revision=revision_pb(rev), source=source_pb(src)
        )
        audit_input = {
            "revision_id": rev.id,
            "file_name": src.file_name,
            "sha256": sha,
            "size": size,
        }
        return out, Audit("kb.source.upload", (rev.id, src.id), audit_input)

    def _drop_upload(self, org: str, upload_id: str) -> None:
        with self.kb.store.tx() as c:
            c.execute("DELETE FROM uploads WHERE org = ? AND id = ?", (org, upload_id))
        part = self.kb.store.upload_part(upload_id)
        if part.exists():
            part.unlink()

    def _put_faq(self, req: pb.PutFaqRequest, who: Principal) -> tuple[Message, Audit | None]:
        rev, src = self.wf.put_faq(
            who,
            req.revision_id,
            req.expected_version,
            question=req.question,
            answer=req.answer,
            source_id=req.source_id,
        )
        return pb.PutFaqResponse(revision=revision_pb(rev), source=source_pb(src)), Audit(
            "kb.faq.put", (rev.id, src.id), _audit_input(req)
        )

    def _remove_source(
        self, req: pb.RemoveSourceRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.remove_source(who, req.revision_id, req.expected_version, req.source_id)
        return pb.RemoveSourceResponse(revision=revision_pb(rev)), Audit(
            "kb.source.remove", (rev.id, req.source_id), _audit_input(req)
        )

    # -- review ------------------------------------------------------------------------------
    def _submit(
        self, req: pb.SubmitRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.submit(who, req.revision_id, req.expected_version)
        return pb.SubmitRevisionResponse(revision=revision_pb(rev)), Audit(
            "kb.revision.submit", (rev.id,), _audit_input(req)
        )

    def _approve(
        self, req: pb.ApproveRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.approve(who, req.revision_id, req.expected_version)
        return pb.ApproveRevisionResponse(revision=revision_pb(rev)), Audit(
            "kb.revision.approve", (rev.id,), _audit_input(req)
        )

    def _return(
        self, req: pb.ReturnRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        rev = self.wf.return_to_draft(who, req.revision_id, req.expected_version, req.reason)
        return pb.ReturnRevisionResponse(revision=revision_pb(rev)), Audit(
            "kb.revision.return", (rev.id,), _audit_input(req)
        )

    # -- processing ----------------------------------------------------------------------------
    def _process(
        self, req: pb.ProcessRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        out = self.queue.enqueue(who, req.revision_id, req.expected_version, req.idempotency_key)
        resp = pb.ProcessRevisionResponse(task=task_pb(out.task), created=out.created)
        return resp, Audit("kb.revision.process", (req.revision_id, out.task.id), _audit_input(req))

    def _retry(self, req: pb.RetryTaskRequest, who: Principal) -> tuple[Message, Audit | None]:
        task = self.queue.retry(who, req.task_id, req.expected_version)
        return pb.RetryTaskResponse(task=task_pb(task)), Audit(
            "kb.task.retry", (task.id, task.revision_id), _audit_input(req)
        )

    def _cancel(self, req: pb.CancelTaskRequest, who: Principal) -> tuple[Message, Audit | None]:
        task = self.queue.cancel(who, req.task_id, req.expected_version)
        return pb.CancelTaskResponse(task=task_pb(task)), Audit(
            "kb.task.cancel", (task.id, task.revision_id), _audit_input(req)
        )

    # -- releases ------------------------------------------------------------------------------
    def _publish(
        self, req: pb.PublishRevisionRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        done = self.wf.publish(who, req.revision_id, req.expected_version, req.expected_release)
        rev = self.wf.revision(who, req.revision_id)
        resp = pb.PublishRevisionResponse(release=release_pb(done), revision=revision_pb(rev))
        return resp, Audit("kb.revision.publish", (done.topic_id, *done.changed), _audit_input(req))

    def _rollback(
        self, req: pb.RollbackTopicRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        done = self.wf.rollback(who, req.topic_id, req.expected_release)
        return pb.RollbackTopicResponse(release=release_pb(done)), Audit(
            "kb.topic.rollback", (done.topic_id, *done.changed), _audit_input(req)
        )

    def _offline(self, req: pb.OfflineTopicRequest, who: Principal) -> tuple[Message, Audit | None]:
        done = self.wf.offline(who, req.topic_id, req.expected_release)
        return pb.OfflineTopicResponse(release=release_pb(done)), Audit(
            "kb.topic.offline", (done.topic_id, *done.changed), _audit_input(req)
        )

    def _reconcile(self, req: pb.ReconcileRequest, who: Principal) -> tuple[Message, Audit | None]:
        report = self.kb.reconcile(who.organisation, who.id)
        targets = (*sorted(report.dropped), *sorted(report.requeued))
        return reconcile_pb(report), Audit(
            "kb.reconcile",
            targets,
            {"dropped": report.dropped, "requeued": sorted(report.requeued)},
        )

    # -- tags, templates, feedback, policy -----------------------------------------------------
    def _create_tag(self, req: pb.CreateTagRequest, who: Principal) -> tuple[Message, Audit | None]:
        tag = self.wf.create_tag(who, req.tag_code, req.display_name, req.sort_order)
        return pb.CreateTagResponse(tag=tag_pb(tag)), Audit(
            "kb.tag.create", (tag.code,), _audit_input(req)
        )

    def _update_tag(self, req: pb.UpdateTagRequest, who: Principal) -> tuple[Message, Audit | None]:
        tag = self.wf.update_tag(
            who,
            req.tag_code,
            req.expected_version,
            display_name=req.display_name if req.HasField("display_name") else None,
            sort_order=req.sort_order if req.HasField("sort_order") else None,
            active=req.active if req.HasField("active") else None,
        )
        return pb.UpdateTagResponse(tag=tag_pb(tag)), Audit(
            "kb.tag.update", (tag.code,), _audit_input(req)
        )

    def _list_tags(self, req: pb.ListTagsRequest, who: Principal) -> tuple[Message, None]:
        rows = self.kb.store.tags(who.organisation, include_inactive=req.include_inactive)
        return pb.ListTagsResponse(tags=[tag_pb(t) for t in rows]), None

    def _put_template(
        self, req: pb.PutTemplateRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        row = self.wf.put_template(
            who, req.template_code, req.body, req.status, req.expected_version
        )
        return pb.PutTemplateResponse(template=template_pb(row)), Audit(
            "kb.template.put", (row.code,), _audit_input(req)
        )

    def _list_templates(self, req: pb.ListTemplatesRequest, who: Principal) -> tuple[Message, None]:
        rows = self.kb.store.templates(who.organisation)
        return pb.ListTemplatesResponse(templates=[template_pb(t) for t in rows]), None

    def _create_feedback(
        self, req: pb.CreateFeedbackRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        fb = self.wf.create_feedback(who, req.topic_id, req.body, req.revision_id)
        return pb.CreateFeedbackResponse(feedback=feedback_pb(fb)), Audit(
            "kb.feedback.create", (fb.id, fb.topic_id), _audit_input(req)
        )

    def _list_feedback(self, req: pb.ListFeedbackRequest, who: Principal) -> tuple[Message, None]:
        if req.status and req.status not in ("OPEN", "RESOLVED", "DRAFTED"):
            raise InvalidRequest("status: OPEN, RESOLVED or DRAFTED", metadata={"field": "status"})
        limit = req.limit or 100
        if not 1 <= limit <= 1000:
            raise InvalidRequest("limit: 1 to 1000", metadata={"field": "limit"})
        rows = self.kb.store.feedback(who.organisation, status=req.status, limit=limit)
        return pb.ListFeedbackResponse(feedback=[feedback_pb(f) for f in rows]), None

    def _resolve_feedback(
        self, req: pb.ResolveFeedbackRequest, who: Principal
    ) -> tuple[Message, Audit | None]:
        fb, draft = self.wf.resolve_feedback(
            who,
            req.feedback_id,
            req.expected_version,
            create_draft=req.create_draft,
            version_label=req.version_label,
        )
        resp = pb.ResolveFeedbackResponse(feedback=feedback_pb(fb))
        if draft is not None:
            resp.draft.CopyFrom(revision_pb(draft))
        targets = (fb.id, draft.id) if draft else (fb.id,)
        return resp, Audit("kb.feedback.resolve", targets, _audit_input(req))

    def _get_policy(self, req: pb.GetPolicyRequest, who: Principal) -> tuple[Message, None]:
        allow, version = self.kb.store.policy(who.organisation)
        return pb.GetPolicyResponse(
            policy=pb.KbPolicy(allow_self_approval=allow, version=version)
        ), None

    def _set_policy(self, req: pb.SetPolicyRequest, who: Principal) -> tuple[Message, Audit | None]:
        allow, version = self.wf.set_policy(
            who, allow_self_approval=req.allow_self_approval, expected_version=req.expected_version
        )
        return pb.SetPolicyResponse(
            policy=pb.KbPolicy(allow_self_approval=allow, version=version)
        ), Audit("kb.policy.set", (who.organisation,), _audit_input(req))


def _operation(op: str) -> str:
    """The audit name of a refused write (the same names as a successful one's)."""
    return _NAMES.get(op, f"kb.{op}")


_NAMES = {
    "CreateTopic": "kb.topic.create",
    "CreateRevision": "kb.revision.create",
    "UpdateRevision": "kb.revision.update",
    "UploadSource": "kb.source.upload",
    "PutFaq": "kb.faq.put",
    "RemoveSource": "kb.source.remove",
    "SubmitRevision": "kb.revision.submit",
    "ApproveRevision": "kb.revision.approve",
    "ReturnRevision": "kb.revision.return",
    "ProcessRevision": "kb.revision.process",
    "RetryTask": "kb.task.retry",
    "CancelTask": "kb.task.cancel",
    "PublishRevision": "kb.revision.publish",
    "RollbackTopic": "kb.topic.rollback",
    "OfflineTopic": "kb.topic.offline",
    "Reconcile": "kb.reconcile",
    "CreateTag": "kb.tag.create",
    "UpdateTag": "kb.tag.update",
    "PutTemplate": "kb.template.put",
    "CreateFeedback": "kb.feedback.create",
    "ResolveFeedback": "kb.feedback.resolve",
    "SetPolicy": "kb.policy.set",
}
