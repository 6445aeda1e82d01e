// The launcher's process that started this rank on its host (Open MPI's mpirun or prted, a Hydra
// proxy, slurmstepd). Once it is gone (a SIGKILL, the OOM killer), nothing is left to end the job
// or read its output. Hydra's proxies and Open MPI 4.1 end their ranks then, and Open MPI 5's
// ranks end themselves, but only from inside an MPI call: a rank waiting in shared memory (the
// node algorithm) or in Python makes none, and would run on for ever. So the watchdog asks
// endRankIfLauncherGone() at every tick (200 ms), and such a rank ends itself.
//
// Which process is the launcher: Open MPI (4.1 and 5) and Hydra start each rank in a process
// group of its own, and a wrapper script that runs Python without `exec` stays in it. So the
// launcher is the parent of this process group's leader when that leader is an ancestor that
// started with this rank's variable (OMPI_COMM_WORLD_RANK and the like: a wrapper, not a launcher
// that left its ranks in its own group), else this process's parent. It is gone once that leader
// has been re-parented (or has gone itself, and with it this process's parent). slurmstepd puts
// a step's tasks in one group led by the first task: only that task's wrapper is seen there (a
// killed srun leaves the step to Slurm anyway). Not watched: a job of one rank (`nohup python
// train.py &` outlives its shell), and a launcher this process cannot see (pid 0 or 1: a PID
// namespace of its own, a container's init).
#pragma once

namespace mpigpu {

// Notes this rank's launcher, once (the first process group: MPI is running, the job started).
void noteLauncher();
// Once the noted launcher has gone: says so on stderr, with why this rank ends, and exits with
// code 3 at once (MPI_Abort would ask the launcher that is no longer there). Else returns.
void endRankIfLauncherGone();

}  // namespace mpigpu
