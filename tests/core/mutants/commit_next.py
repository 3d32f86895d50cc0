"""A wrong commit decision, kept so the CrossHair gate is shown able to fail.

It hands out ``next`` instead of the watermark: the bug the issue names (and the
one TLC's mutant model carries). CrossHair must find inputs that break the
postcondition, e.g. ``processed < next``.
"""

import icontract


@icontract.require(lambda committed, processed, next_: 0 <= committed <= processed <= next_)
@icontract.ensure(lambda committed, processed, result: committed <= result <= processed)
def offset_to_commit(committed: int, processed: int, next_: int) -> int:
    """The offset a commit request hands out (wrong on purpose)."""
    return next_
