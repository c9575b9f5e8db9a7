"""Run bookkeeping shared by the scripts in cleanrl/: run directories, logging,
progress display, checkpoints and saved models. Nothing here changes what an agent
learns; every algorithm lives whole in its own script."""
