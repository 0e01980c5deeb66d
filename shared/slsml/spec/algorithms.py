"""The update rules a run may take (``--algorithm``), one declaration each: the single place a rule is registered.
The spec checks a run's options against its declaration; ``slsml.rules`` loads each rule from the module it names."""

from __future__ import annotations

from typing import NamedTuple

# TrainingSpec fields of the rules that take local steps (``Declaration.local``)
LOCAL_OPTIONS = ("local_steps", "local_optimizer", "local_learning_rate", "local_momentum")
# TrainingSpec fields of the global data order, which a partitioned rule does not take (``Declaration.partitioned``)
ORDER_OPTIONS = ("shuffle", "shuffle_block")


class Declaration(NamedTuple):
    """An update rule: its ``--algorithm`` name, the module that defines it (``RULE``, an ``UpdateRule``) and what
    the rest of slsml needs to know of it without importing it."""

    name: str
    module: str
    title: str
    """What the rule is called in the help of the options it takes."""
    about: str
    """What a round does under it, for ``--algorithm``'s help."""
    local: bool = False
    """A round takes ``local_steps`` steps of the local optimizer, one per global batch (else one gradient)."""
    partitioned: bool = False
    """Each worker slot trains on its own partition of the training set and keeps its state across rounds: the fleet
    is fixed, late updates are not folded, and the global data order's options do not apply."""
    options: tuple[str, ...] = ()
    """The TrainingSpec fields of this rule alone (beyond ``LOCAL_OPTIONS``)."""

    @property
    def taken(self) -> frozenset[str]:
        """The rule-dependent TrainingSpec fields (``OPTIONS``) this rule takes."""
        return frozenset(
            (*self.options, *(LOCAL_OPTIONS if self.local else ()), *(() if self.partitioned else ORDER_OPTIONS))
        )


DECLARATIONS: tuple[Declaration, ...] = (
    Declaration(
        "gradient",
        "slsml.rules.gradient",
        "gradient averaging",
        "workers send the gradient of their slice of one global batch (gradient averaging)",
    ),
    Declaration(
        "average",
        "slsml.rules.averaging",
        "model averaging",
        "each takes local_steps steps of the local optimizer and sends its weight change (model averaging)",
        local=True,
        options=("local_state", "server"),
    ),
    Declaration(
        "admm",
        "slsml.rules.admm",
        "ADMM",
        "each keeps its own data partition, local model and dual, takes"
        " local_steps steps on its partition's loss plus the proximal term, and the reducers form the"
        " consensus (models without hidden layers)",
        local=True,
        partitioned=True,
        options=("admm_rho",),
    ),
)
ALGORITHMS: dict[str, Declaration] = {rule.name: rule for rule in DECLARATIONS}

# the TrainingSpec fields that some rules take and others refuse
OPTIONS = (*LOCAL_OPTIONS, *dict.fromkeys(o for rule in ALGORITHMS.values() for o in rule.options), *ORDER_OPTIONS)


def taking(option: str) -> list[str]:
    """The names of the rules that take ``option`` (one of ``OPTIONS``)."""
    return [name for name, rule in ALGORITHMS.items() if option in rule.taken]


def titles(option: str) -> str:
    """The rules that take ``option``, as its help names them (e.g. ``model averaging and ADMM``)."""
    return " and ".join(ALGORITHMS[name].title for name in taking(option))
