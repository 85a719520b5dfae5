"""Control-plane settings: defaults from RELIABILITY.md §2.2, overridable by GPUPOOL_* environment variables
or CLI flags. Validated at load: a bad value names its setting."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path = Path("gpupool-data")
    database_url: str = ""
    host: str = "127.0.0.1"
    port: int = Field(default=8181, ge=0, le=65535)
    heartbeat_s: float = Field(default=5.0, gt=0)
    suspect_after_s: float = Field(default=15.0, gt=0)
    lost_after_s: float = Field(default=60.0, gt=0)
    fence_s: float = Field(default=40.0, gt=0)
    kill_grace_s: float = Field(default=10.0, ge=0)
    launch_ttl_s: float = Field(default=120.0, gt=0)
    cycle_interval_s: float = Field(default=0.5, gt=0)
    profile: str = "default"
    placement: str = "best"
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    impaired_silent_share: float = Field(default=0.55, gt=0, le=1)
    metering_interval_s: float = Field(default=10.0, gt=0)
    metering_period_s: int = Field(default=3600, gt=0, le=86400)

    @model_validator(mode="after")
    def _timing(self) -> Settings:
        if self.fence_s + self.kill_grace_s >= self.lost_after_s:
            raise ValueError("fence_s + kill_grace_s must be below lost_after_s, or a lost node's job could run twice")
        if self.suspect_after_s >= self.lost_after_s:
            raise ValueError("suspect_after_s must be below lost_after_s")
        return self

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'gpupool.db').resolve()}"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from GPUPOOL_<NAME> variables, then `overrides` (CLI flags) on top."""
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"GPUPOOL_{name.upper()}")
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
