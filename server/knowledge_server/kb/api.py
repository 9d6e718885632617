"""``KnowledgeBaseService`` (Retrieve, Answer) in the application layer: one call's checks,
retrieval and model call in a worker thread under the end-to-end budget, its answer as
protobuf. The gRPC servicer and the HTTP face (``kb/http.py``) both call this.

The organisation is ``principal.organisation``; no request field names one. The budget
(``RetrieveSettings.total_timeout_ms``) starts when the call arrives; when it runs out the
call answers UNAVAILABLE naming the step that was waiting (``DependencyUnavailable``), and
the thread's work is left to finish on its own. Logs carry the trace id, counts and
timings, never the question, a tag code or any text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from knowledge_server import deadline
from knowledge_server._gen.knowledge.v1 import kb_retrieve_pb2 as pb
from knowledge_server.auth_model import Principal
from knowledge_server.errors import DependencyUnavailable, KnowledgeError
from knowledge_server.kb.deps import Budget
from knowledge_server.kb.retrieve import (
    NO_EVIDENCE,
    Retrieval,
    Retriever,
    Step,
    check_citations,
    elapsed_ms,
    valid_trace_id,
)
from knowledge_server.logs import get_logger

__all__ = ["POOL", "KnowledgeBaseApi"]

log = get_logger("knowledge.kb.retrieve")

R = TypeVar("R")

# The thread pool retrieval runs in (deadline.off_loop): its own, so a hanging dependency
# holds retrieval's threads only.
POOL = "retrieve"
# Added to the budget before the waiting side gives up on the thread: a step that ends
# right at the budget still reports its own failure.
_GRACE_S = 0.05


@dataclass
class _Answered:
    retrieval: Retrieval
    template_code: str
    text: str
    model_ms: int


class KnowledgeBaseApi:
    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever

    async def _run(
        self, event: str, work: Callable[[Budget, Step], R], trace_id: str, started: float
    ) -> R:
        """``work`` in a retrieval thread under a new budget. Past the budget, or when a
        dependency fails, the call is ``DependencyUnavailable`` naming the step (the
        trace id in its metadata), logged as ``<event>_unavailable``; a request refused
        (``InvalidRequest``, ``UnknownTag``) gets the trace id in its metadata too and is
        logged as ``<event>_refused``."""
        budget = Budget.of_ms(self.retriever.settings.total_timeout_ms)
        step = Step()

        def in_thread() -> R:
            step.name = "metadata"  # a thread took the call up: its first reads are there
            return work(budget, step)

        try:
            return await asyncio.wait_for(
                deadline.off_loop(in_thread, pool=POOL),
                timeout=max(0.0, budget.remaining()) + _GRACE_S,
            )
        except TimeoutError:
            failed = DependencyUnavailable(
                step.name, "timeout (budget exhausted)", trace_id=trace_id
            )
        except DependencyUnavailable as exc:
            exc.metadata["trace_id"] = trace_id
            failed = exc
        except KnowledgeError as exc:
            # A refused request (its query, top_k, a tag code, the template) carries the
            # trace id too, in its details and its log line, as every answer of the call.
            exc.metadata["trace_id"] = trace_id
            log.info(
                f"{event}_refused",
                trace_id=trace_id,
                reason=exc.reason,
                field=exc.metadata.get("field", ""),
                ms=elapsed_ms(started),
            )
            raise
        log.warning(
            f"{event}_unavailable",
            trace_id=trace_id,
            dependency=failed.dependency,
            cause=failed.cause,
            ms=elapsed_ms(started),
        )
        raise failed from None

    async def retrieve(
        self, req: pb.RetrieveRequest, principal: Principal, trace_id: str | None
    ) -> pb.RetrieveResponse:
        tid = valid_trace_id(trace_id)
        started = time.perf_counter()
        r = self.retriever

        def work(budget: Budget, step: Step) -> Retrieval:
            with r.store.reads_until(budget.deadline):
                checked = r.check_request(
                    principal, req.query, req.all_tag_codes, req.any_tag_codes, req.top_k
                )
                return r.retrieve(principal, checked, tid, budget, step)

        result = await self._run("kb.retrieve", work, tid, started)
        out = pb.RetrieveResponse(
            answerable=bool(result.sources),
            trace_id=tid,
            sources=[ev.pb() for ev in result.sources],
            reason_code="" if result.sources else NO_EVIDENCE,
            trace=result.trace,
        )
        _log("kb.retrieve", tid, result, started)
        return out

    async def answer(
        self, req: pb.AnswerRequest, principal: Principal, trace_id: str | None
    ) -> pb.AnswerResponse:
        tid = valid_trace_id(trace_id)
        started = time.perf_counter()
        r = self.retriever

        def work(budget: Budget, step: Step) -> _Answered:
            with r.store.reads_until(budget.deadline):
                checked = r.check_request(
                    principal, req.query, req.all_tag_codes, req.any_tag_codes, req.top_k
                )
                code, body = r.template(principal, req.template_code)
                result = r.retrieve(principal, checked, tid, budget, step)
            if not result.sources:
                return _Answered(result, code, r.settings.no_evidence_reply, 0)
            step.name = "chat"
            asked = time.perf_counter()
            text = r.answer(checked.query, body, result.sources, budget, tid)
            model_ms = elapsed_ms(asked)
            # A source taken offline while the model wrote: the answer rests on it, so
            # there is no answer to give (its markers would name what is no longer cited).
            step.name = "metadata"
            with r.store.reads_until(budget.deadline):
                kept = r.still_citable(principal.organisation, result.sources, result.trace)
            if len(kept) != len(result.sources):
                result.sources = []
                return _Answered(result, code, r.settings.no_evidence_reply, model_ms)
            return _Answered(result, code, text, model_ms)

        done = await self._run("kb.answer", work, tid, started)
        result = done.retrieval
        if result.sources:
            text, check = check_citations(done.text, len(result.sources))
        else:
            text, check = done.text, pb.CitationCheck(status="no_evidence")
        out = pb.AnswerResponse(
            answerable=bool(result.sources),
            trace_id=tid,
            answer=text,
            sources=[ev.pb() for ev in result.sources],
            reason_code="" if result.sources else NO_EVIDENCE,
            citation_check=check,
            template_code=done.template_code,
            trace=result.trace,
            model_ms=done.model_ms,
        )
        _log("kb.answer", tid, result, started, citation=check.status)
        return out


def _log(event: str, tid: str, result: Retrieval, started: float, **extra: object) -> None:
    t = result.trace
    log.info(
        event,
        trace_id=tid,
        sources=len(result.sources),
        candidates=t.candidates,
        dropped_old_revision=t.dropped_old_revision,
        dropped_other_organisation=t.dropped_other_organisation,
        dropped_uncitable=t.dropped_uncitable,
        below_min_score=t.below_min_score,
        not_reembedded=result.not_reembedded,
        ms=elapsed_ms(started),
        **extra,
    )
