"""sc-trainer: the reference RL trainer (PPO, GRPO) on sc's worker groups.

One driver process runs the loop as plain sequential Python; every stage is one call on a
worker group. :class:`TaskRunner` maps roles to worker classes and resource pools, starts
the backend through a :class:`Launcher` and builds the :class:`RayPPOTrainer`, whose
``init_workers`` creates the groups and whose ``fit`` trains on the batches of one
:class:`RolloutSource`. ``sc-demo`` is the command (:mod:`sc_trainer.cli`).

Where things live (each a subpackage, its names in its own ``__all__``):

* :mod:`sc_trainer.trainer`: the loop, the roles and their worker groups, the stages that
  run on the driver;
* :mod:`sc_trainer.rollout`: where the batch comes from (worker groups, one step ahead,
  engine servers with partial rollout), the server fleet on Ray, the weight publisher;
* :mod:`sc_trainer.agents`: multi-turn agent sessions as a rollout source;
* :mod:`sc_trainer.faults`: what happens when a worker dies (recovery in place) and the
  faults that test it;
* :mod:`sc_trainer.runs`: what survives the driver (the output folder, checkpoints,
  detached runs a new driver re-attaches to);
* :mod:`sc_trainer.config`, :mod:`sc_trainer.launch`, :mod:`sc_trainer.tasks`: the
  configuration, the launchers and the task runner, the built-in tasks.
"""

from sc_dispatch import _public

from ._errors import ScTrainerError, TrainerConfigError
from ._settings import SETTINGS
from .agents import AgentEnvironment
from .config import RunConfig, TaskConfig, TrainerConfig
from .launch import (
    DetachedRayLauncher,
    InProcessLauncher,
    RayLauncher,
    TaskRunner,
    make_launcher,
)
from .rollout import PromptSource, RolloutSource
from .runs import RunOutput
from .tasks import make_task
from .trainer import Launcher, RayPPOTrainer, Role, RunResult

__version__ = "0.1.0"

__all__ = [
    "AgentEnvironment",
    "DetachedRayLauncher",
    "InProcessLauncher",
    "Launcher",
    "PromptSource",
    "RayLauncher",
    "RayPPOTrainer",
    "Role",
    "RolloutSource",
    "RunConfig",
    "RunOutput",
    "RunResult",
    "SETTINGS",
    "ScTrainerError",
    "TaskConfig",
    "TaskRunner",
    "TrainerConfig",
    "TrainerConfigError",
    "__version__",
    "make_launcher",
    "make_task",
]

_public.publish(globals())
