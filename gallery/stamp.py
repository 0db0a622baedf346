"""Which model a gallery's codes came from: its name, version and card checksum.

Vectors of two model versions live in different spaces, and comparing them returns neighbours
that mean nothing, silently. So every gallery is stamped with the model that embedded it, and
the service serves a gallery only beside the model whose card has the same checksum
(:meth:`Stamp.require`); ``smso-index`` refuses to mix rows of two models in one gallery.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from modelcard.card import ModelCard

__all__ = ["Stamp", "StampMismatchError"]


class StampMismatchError(ValueError):
    """A gallery's stamp is not the model's it would be served or mixed with."""


@dataclass(frozen=True)
class Stamp:
    """The model whose embeddings a gallery holds."""

    model_name: str
    model_version: str
    card_sha256: str  # :meth:`modelcard.card.ModelCard.sha256`

    @classmethod
    def of(cls, card: ModelCard) -> Stamp:
        return cls(card.name, card.model_version, card.sha256())

    def describe(self) -> str:
        """``fashion_mnist-small_cnn-smso version 0123456789ab (card 9f86d081884c)``."""
        return f"{self.model_name} version {self.model_version} (card {self.card_sha256[:12]})"

    def require(self, other: Stamp, what: str, against: str) -> None:
        """:class:`StampMismatchError` naming both unless ``other`` is this model (the card's
        checksum decides: a re-export under the same name and version with another card is
        another model)."""
        if other.card_sha256 != self.card_sha256:
            raise StampMismatchError(
                f"{what} was built with {self.describe()}, {against} is {other.describe()}: "
                "embeddings of two models cannot be compared"
            )

    def to_json(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_json(cls, fields: object) -> Stamp:
        if not isinstance(fields, dict) or set(fields) != {
            "model_name",
            "model_version",
            "card_sha256",
        }:
            raise ValueError("stamp must hold model_name, model_version and card_sha256")
        if not all(isinstance(value, str) and value for value in fields.values()):
            raise ValueError("stamp's fields must be non-empty strings")
        return cls(**fields)
