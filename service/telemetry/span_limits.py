"""OpenTelemetry's span limits (``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
``OTEL_SPAN_EVENT_COUNT_LIMIT``, ...) applied to span records, as the SDK applies them to the
spans it makes.

The service records its own spans as plain tuples (``service.telemetry.span_export.Record``), which
never pass through the SDK's ``Span``; this module gives them the same treatment:

- attributes: at most ``max_span_attributes`` (events: ``max_event_attributes``, links:
  ``max_link_attributes``), the last ones kept, string values cut to
  ``max_span_attribute_length`` (events and links: ``max_attribute_length``), by the SDK's own
  ``BoundedAttributes``;
- events and links: the last ``max_events`` / ``max_links``;
- what was dropped is counted, for OTLP's ``dropped_*_count`` fields.

With the SDK's default limits (no length limit, 128 of each) a span of the service's size is
returned as it is, at the cost of a few comparisons.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.util import BoundedList

__all__ = ["bound_attributes", "bound_sequence", "default_limits", "dropped"]


class _NoLimitNotice(logging.Filter):
    """The SDK logs a warning for every string it cuts to the length limit and every attribute
    it drops for the count limit: with a limit set, that is every request's span. Cutting and
    dropping is what the limits ask for, and what was dropped is counted in the span; the SDK's
    other warnings (values it cannot use) stay."""

    NOTICES = ("String attribute value exceeds max length", "Attributes dict is full")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOTICES)


logging.getLogger("opentelemetry.attributes").addFilter(_NoLimitNotice())


def bound_attributes(
    attributes: Mapping[str, Any], count: int | None, length: int | None, immutable: bool = True
) -> Mapping[str, Any]:
    """``attributes`` as they are when within ``count`` entries and ``length`` characters per
    string (no length limit), else the SDK's ``BoundedAttributes`` of them, which cuts, drops
    and counts (``dropped``) as the SDK's spans do."""
    if length is None and (count is None or len(attributes) <= count):
        return attributes
    return BoundedAttributes(count, attributes, immutable=immutable, max_value_len=length)


def bound_sequence(items: Sequence[Any], count: int | None) -> BoundedList | Sequence[Any]:
    """``items`` when within ``count``, else a ``BoundedList`` of the last ``count``."""
    if count is None or len(items) <= count:
        return items
    return BoundedList.from_seq(count, items)


def dropped(bounded: Mapping[str, Any] | Sequence[Any]) -> int:
    """How many entries ``bound_attributes`` or ``bound_sequence`` dropped."""
    return getattr(bounded, "dropped", 0)


def default_limits() -> SpanLimits:
    """The limits the environment sets (``OTEL_*_LIMIT``), else the SDK's defaults."""
    return SpanLimits()
