"""What an exported model file promises its readers, shared by ``export`` (which writes it) and
``service`` (which reads it): where the card is (:data:`CARD_KEY`), its format and version, and
the typicality statistics and score it carries (:mod:`modelcard.typicality`). numpy only."""

__all__ = ["CARD_FORMAT", "CARD_KEY", "CARD_VERSION"]

#: The ONNX ``metadata_props`` key whose value is the card, as JSON (onnxruntime:
#: ``session.get_modelmeta().custom_metadata_map``).
CARD_KEY = "smso.model_card"
#: The card's ``format`` and ``version`` fields: what export writes and the service reads.
CARD_FORMAT = "smso-model-card"
CARD_VERSION = 1
