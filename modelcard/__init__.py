"""What an exported model file promises its readers, shared by ``export`` (which writes it),
``service`` and ``batch`` (which read it).

* where the card is (:data:`CARD_KEY`), its format and version (here);
* the card itself, one strict type: :class:`modelcard.card.ModelCard` (pydantic only), its JSON
  Schema (:mod:`modelcard.schema`), and the upgrade of older cards
  (:func:`modelcard.migration.migrate`); the bound on its nesting, checked before it is parsed
  (:mod:`modelcard.nesting`);
* the typicality statistics and score it carries (:mod:`modelcard.typicality`, numpy only).

Nothing here imports torch or onnx.
"""

from typing import Final

__all__ = ["CARD_FORMAT", "CARD_KEY", "CARD_VERSION"]

#: The ONNX ``metadata_props`` key whose value is the card, as JSON (onnxruntime:
#: ``session.get_modelmeta().custom_metadata_map``).
CARD_KEY = "smso.model_card"
#: The card's ``format`` and ``version`` fields: what export writes and the service reads.
CARD_FORMAT: Final = "smso-model-card"
CARD_VERSION: Final = 1
