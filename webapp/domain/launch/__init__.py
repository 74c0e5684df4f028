"""Starting resumed jobs: `slurm` submits a batch script with sbatch and follows the job
with squeue/scontrol/sacct (the Slurm client must be on the launch worker's host)."""
