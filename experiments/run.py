"""Run a sweep: ``python -m experiments.run experiment=lazy_prenorm_blog [overrides]`` (``-m`` for multirun).

Examples::

    python -m experiments.run                                   # experiment=smoke (CPU default)
    python -m experiments.run experiment=lazy_prenorm_blog dsl=[triton,tlx] shape=llama3_8b
    python -m experiments.run -m experiment=lazy_prenorm_blog dsl=triton,helion,tlx
    python -m experiments.run experiment=lazy_prenorm_blog run_id=20261129_h200   # resume that run
"""

import hydra
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base="1.3", config_path="../configs", config_name="config")
def main(cfg: DictConfig) -> None:
    from normfuse.sweep import run

    try:
        run(OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:  # a bad config: say what is wrong, without a traceback
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:  # the points already measured are on disk; the same run_id resumes after them
        raise SystemExit("interrupted: rerun with the same run_id=... to resume") from None


if __name__ == "__main__":
    main()
