"""The Lifeboat client that training jobs import. Standard library only at its core;
`lifeboat.torch`, `lifeboat.lightning` and `lifeboat.hf` import their framework lazily.

    import lifeboat

    with lifeboat.Run("my-run") as run:          # LIFEBOAT_URL / LIFEBOAT_TOKEN from the env
        ...
        run.checkpoint("ckpt/step-1000.pt", step=1000)

    path = lifeboat.latest("my-run")             # the newest verified checkpoint, local
"""

from lifeboat.config import Config, ConfigError
from lifeboat.restore import LatestError, latest, latest_id
from lifeboat.run import CheckpointReport, Run, current_run
from lifeboat.version import __version__

__all__ = [
    "CheckpointReport",
    "Config",
    "ConfigError",
    "LatestError",
    "Run",
    "current_run",
    "latest",
    "latest_id",
    "__version__",
]
