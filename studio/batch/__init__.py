"""Many clips in one run: a job list, one warm engine per avatar, a state file that makes a
rerun skip finished jobs, and the same jobs on a Ray cluster (:mod:`studio.batch.ray_run`)."""
