"""Run a sweep: ``python -m experiments.run experiment=lazy_prenorm_blog [overrides]`` (``-m`` for multirun).

Examples::

    python -m experiments.run                                   # experiment=smoke (CPU default)
    python -m experiments.run experiment=lazy_prenorm_blog dsl=[triton,tlx] shape=llama3_8b
    python -m experiments.run experiment=lazy_prenorm_blog run_id=20261129_h200   # resume that run
    python -m experiments.run experiment=lazy_prenorm_rep replicates=3            # rep0/ rep1/ rep2/, merged report
    python -m experiments.run -m experiment=lazy_prenorm_rep replicate=0,1,2 gpu=auto \\
        hydra/launcher=submitit_local run_id=R                  # one job per replicate, one GPU each

Exit status: 0 done, 2 a configuration error (nothing measured), 130 interrupted (Ctrl-C or SIGTERM; the message
names the run_id that resumes it).
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    from normfuse.sweep import SweepInterrupted, run

    try:
        run(OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:  # a bad config: say what is wrong, without a traceback
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except SweepInterrupted as e:  # the points already measured are on disk; the same run_id resumes after them
        print(f"interrupted: {e.run_dir} holds what was measured; resume with the same overrides and "
              f"run_id={e.run_id}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
