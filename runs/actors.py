"""Who did it: every service takes an Actor so the ledger can name a person or a token."""

from __future__ import annotations

from dataclasses import dataclass

from runs.models import ActorKind


@dataclass(frozen=True, slots=True)
class Actor:
    kind: str
    id: str
    name: str

    @classmethod
    def system(cls, name: str = "safestop") -> Actor:
        return cls(kind=ActorKind.SYSTEM, id="", name=name)

    @classmethod
    def for_user(cls, user: object) -> Actor:
        return cls(
            kind=ActorKind.USER,
            id=str(getattr(user, "pk", "")),
            name=str(getattr(user, "username", "")),
        )

    @classmethod
    def for_token(cls, token: object) -> Actor:
        return cls(
            kind=ActorKind.API_CLIENT,
            id=str(getattr(token, "pk", "")),
            name=str(getattr(token, "name", "")),
        )
