"""What proving a run's messages and objects costs (``slsml.pipeline.proof``): KMS requests once per run and container,
none per message; on each hop, the CPU time of a signature and of its check."""

from __future__ import annotations

from pydantic import BaseModel, Field

from slsml.accounting import prices
from slsml.spec import wiring

# ECDSA P-256 (deterministic, RFC 6979) over a message's JSON, measured in Python on a loaded 2-core host
SIGN_MS = 0.15
CHECK_MS = 0.3


class ProofCost(BaseModel):
    """A run's proofs: what KMS is asked once per run and container, and what each message hop spends on them."""

    key_pairs: int = Field(description="GenerateDataKeyPairWithoutPlaintext at the launch: one per signing kind")
    vouches: int = Field(description="kms:Encrypt at the launch: its vouch for the run's public keys")
    unseals: int = Field(
        description="kms:Decrypt, once per container and run: the vouch, by every step's container (W workers, R"
        " reducers, one of each other signing step), and its own kind's private key, by each (all sign)"
    )
    kms_requests: int = Field(description="all of them, a run")
    dollars: float = Field(description="what they cost, a run")
    messages_per_iteration: int = Field(
        description="messages signed and checked an iteration: Work, WorkDone,"
        " Reduce, ReduceDone (one per worker or shard), ModelMerged"
    )
    sign_ms: float = Field(description="a message signed, on the hop's sender")
    check_ms: float = Field(description="a message's proof checked, on its receiver: no request")


def proof_cost(workers: int, reducers: int, price_table: prices.PriceTable) -> ProofCost:
    """The proofs of a run of ``workers`` and ``reducers``, each warm container of a step kept for the run."""
    containers = workers + reducers + len(wiring.SIGNERS) - 2  # the other signing steps: one container each
    pairs, vouches, unseals = len(wiring.SIGNERS), 1, 2 * containers
    return ProofCost(
        key_pairs=pairs,
        vouches=vouches,
        unseals=unseals,
        kms_requests=pairs + vouches + unseals,
        dollars=pairs * price_table.kms_key_pair + (vouches + unseals) * price_table.kms_request,
        messages_per_iteration=2 * workers + 2 * reducers + 1,
        sign_ms=SIGN_MS,
        check_ms=CHECK_MS,
    )
