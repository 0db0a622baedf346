"""Older model cards brought to the current shape: the one place that knows what they lacked.

Every card so far is ``version`` 1: its sections grew without a new version, each addition one
that readers of the earlier cards could ignore. :func:`migrate` fills in what a version-1 card
written before an addition lacks, so that :class:`modelcard.card.ModelCard` can require every
field of the current shape and no reader needs a fall-back of its own. The additions, oldest
first, and what an older card gets in their place:

* ``model.form_choice``: ``null`` (the form's costs were not recorded);
* ``served``: ``<dataset>-<backbone>-<head>`` and the checkpoint's sha256[:12], what
  ``smso-export`` names a model by default (``unknown`` without a checkpoint);
* ``typicality``: ``null`` (no reference: the model is served without typicality);
* ``outputs.features`` and ``typicality.features``: ``null`` (the file has no ``features``
  output; a reference's score has three terms);
* ``typicality.output`` and ``output_max_difference``: ``null`` (the service computes the
  score);
* every key in every card, ``null`` where the card has no such section or value.

A card made by hand (as the tests' stand-in models are) may hold only what a server needs:
``format``, ``version``, ``classes``, ``input`` (``channels``, ``height``, ``width``),
``preprocessing`` (``colour``, ``crop``, ``mean``, ``std``) and ``model`` (``backbone``,
``head``, ``embedding_dim``). It gets the rest as above and: ``input.dynamic_size`` false,
``preprocessing.resize`` null (images are resized to the crop), ``outputs`` from the classes and
``model.embedding_dim``, ``model.head_options`` ``{}``, ``model.reduce_dim`` and ``model.form``
null, ``dataset`` ``unknown``, and ``checkpoint``, ``metrics``, ``export``, ``parity`` and
``versions`` null (not recorded). ``input.name``, ``layout``, ``dtype`` and
``preprocessing.scale`` have one value in version 1, which the type supplies.

A card of another ``version`` is refused here. Values are never changed, only added: a card
that is wrong (another ``format``, a ``version`` that is no number) stays wrong, and the type
refuses it naming the field.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, TypeGuard

from modelcard import CARD_VERSION

__all__ = ["SUPPORTED_VERSIONS", "migrate"]

#: The card versions :func:`migrate` reads.
SUPPORTED_VERSIONS = (CARD_VERSION,)

#: Values a version-1 card may lack, by section (``""``: the card itself), and what it gets.
_ABSENT: dict[str, dict[str, Any]] = {
    "": {
        "dataset": "unknown",
        "checkpoint": None,
        "metrics": None,
        "export": None,
        "parity": None,
        "versions": None,
        "typicality": None,
    },
    "input": {"dynamic_size": False},
    "preprocessing": {"resize": None},
    "model": {"head_options": {}, "reduce_dim": None, "form": None, "form_choice": None},
    "outputs": {"features": None},
    "checkpoint": {"file": None},
    "typicality": {"features": None, "output": None, "output_max_difference": None},
}


def migrate(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The card ``raw`` (parsed JSON) in the current shape: a new dictionary, ``raw`` untouched.

    ``ValueError`` for a ``version`` this does not read; see the module's docstring for what
    each older card gets.
    """
    card = copy.deepcopy(dict(raw))
    version = card.get("version")
    if _is_int(version) and version not in SUPPORTED_VERSIONS:
        supported = ", ".join(str(v) for v in SUPPORTED_VERSIONS)
        raise ValueError(f"model card version {version} is not supported (supported: {supported})")
    if "outputs" not in card and (outputs := _outputs(card)) is not None:
        card["outputs"] = outputs
    if "served" not in card and (served := _served(card)) is not None:
        card["served"] = served
    for name, absent in _ABSENT.items():
        section = card if not name else card.get(name)
        if isinstance(section, dict):
            for key, value in absent.items():
                section.setdefault(key, copy.deepcopy(value))
    return card


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _outputs(card: dict[str, Any]) -> dict[str, Any] | None:
    """``logits (N, K)`` and ``embedding (N, p)`` from the classes and the embedding's size,
    where both are there to read (else the type names what is missing)."""
    classes, model = card.get("classes"), card.get("model")
    dim = model.get("embedding_dim") if isinstance(model, dict) else None
    if not isinstance(classes, list) or not classes or not _is_int(dim) or dim < 1:
        return None
    return {"logits": ["N", len(classes)], "embedding": ["N", dim]}


def _served(card: dict[str, Any]) -> dict[str, str] | None:
    """The name and version ``smso-export`` serves a model under by default."""
    model, checkpoint = card.get("model"), card.get("checkpoint")
    dataset = card.get("dataset", _ABSENT[""]["dataset"])
    if not isinstance(model, dict):
        return None
    parts = [dataset, model.get("backbone"), model.get("head")]
    names = [part for part in parts if isinstance(part, str)]
    if len(names) < len(parts):
        return None
    sha256 = checkpoint.get("sha256") if isinstance(checkpoint, dict) else None
    return {
        "name": "-".join(names),
        "version": sha256[:12] if isinstance(sha256, str) and sha256 else "unknown",
    }
