"""The studies' tests (``experiments/``): their maths against references, quick runs end to end,
and the published records against the pages that quote them."""
