"""Errors raised by the planner for bad input.

Every error names what was wrong (a field, or a rule of the plan format), the
value that broke it and what is allowed, so a user can fix the file without
reading code. The CLI maps these to exit status 2 in one place.
"""

QUOTED_CHARS = 80  # an error quotes at most this much of a value: input can be large or hostile


def quote(value) -> str:
    """repr(value), cut to a short prefix."""
    text = repr(value)
    return text if len(text) <= QUOTED_CHARS else f"{text[:QUOTED_CHARS]}... ({len(text)} characters)"


class SpecError(ValueError):
    """A cluster, model or events file has a bad or missing field."""

    def __init__(self, source: str, field: str, value, allowed: str):
        self.source, self.field, self.value, self.allowed = source, field, value, allowed
        super().__init__(f"{source}: field '{field[:QUOTED_CHARS]}' = {quote(value)}: {allowed}")


# PlanError's rules that say no plan could be made, rather than that a plan given breaks a rule.
NO_PLAN_RULES = ("no-feasible-plan", "no-usable-device")


class PlanError(ValueError):
    """A plan breaks one of the validity rules of the cost model (section 3), or none can be
    made (NO_PLAN_RULES).

    `rule` is a short stable name, e.g. ``device-used-twice``.
    """

    def __init__(self, rule: str, detail: str):
        self.rule, self.detail = rule, detail
        super().__init__(f"{'no plan' if rule in NO_PLAN_RULES else 'invalid plan'} ({rule}): {detail}")
