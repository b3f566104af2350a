"""Pure command deciders: a state and a command in, the events to record or a refusal out.

The admission and ledger services, the in-memory virtual cluster and the scenario engines all
answer commands through `decide_command`, so a rule (a name's pattern, a derived id, which
phases a job may be paused from, how project terms merge) is written once.
"""

from policy.commands.decide import decide_command
from policy.commands.outcome import Accepted, Outcome, Refused

__all__ = ["Accepted", "Outcome", "Refused", "decide_command"]
