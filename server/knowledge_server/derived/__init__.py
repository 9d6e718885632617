"""Derived layer (L3): skill catalog, actors, skill uses and assignments in ``derived.sqlite``.

Built from the episodes store's metadata (never its text) and ``SKILL.md`` files; see
``docs/derived.md``.
"""

from .build import RebuildReport, detect_skill_uses, rebuild, session_actor
from .lane import InvalidQuery, SkillHit, search_skills
from .skills import Catalog, CatalogProblem, Skill, default_roots, load_catalog, load_skill
from .store import (
    ACTOR_KINDS,
    DB_FILE,
    ActorInfo,
    Assignment,
    DerivedStore,
    SkillUse,
    assignment_id_for,
)

__all__ = [
    "ACTOR_KINDS",
    "DB_FILE",
    "ActorInfo",
    "Assignment",
    "Catalog",
    "CatalogProblem",
    "DerivedStore",
    "InvalidQuery",
    "RebuildReport",
    "Skill",
    "SkillHit",
    "SkillUse",
    "assignment_id_for",
    "default_roots",
    "detect_skill_uses",
    "load_catalog",
    "load_skill",
    "rebuild",
    "search_skills",
    "session_actor",
]
