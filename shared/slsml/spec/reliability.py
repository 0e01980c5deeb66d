"""Deployment settings that trade completeness for progress when parts of the system are slow.

``ReadPolicy``: how long a reducer waits for one ranged GET of an update part, and which fraction
of the participants' parts it must have before it may go on without the others. Set per function
through environment variables, so a deployment tunes it without touching run configs.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

READ_TIMEOUT_ENV = "SLSML_READ_TIMEOUT_S"
READ_QUORUM_ENV = "SLSML_READ_QUORUM"


class ReadPolicy(BaseSettings):
    """``ReadPolicy()`` reads ``SLSML_READ_TIMEOUT_S`` and ``SLSML_READ_QUORUM`` (defaults: 30 s, 1.0).

    A reducer goes on once at least ⌈quorum·P⌉ of its P parts are read and every other read has
    run for longer than ``timeout_s``; those parts are dropped from the average. With quorum 1 it
    waits for every part however long it takes.
    """

    model_config = SettingsConfigDict(env_prefix="SLSML_READ_", extra="ignore", frozen=True)

    timeout_s: float = Field(default=30.0, gt=0, description="how long one read may take before it may be dropped")
    quorum: float = Field(default=1.0, gt=0, le=1, description="fraction of the parts that must be read")

    def environment(self) -> dict[str, str]:
        """The variables that give a function this policy."""
        return {READ_TIMEOUT_ENV: repr(self.timeout_s), READ_QUORUM_ENV: repr(self.quorum)}
