# Sourced by the MPI tests (test_mpi.sh, test_mpi_shard.sh) with their arguments
# REMAT_BINARY MPIRUN: sets remat, mpirun, dir (a temporary folder removed on exit) and
# fail=0, and the environment every mpirun here needs; exits 77 (skipped) without mpirun.
remat=$1
mpirun=${2:-mpirun}
if ! command -v "$mpirun" >/dev/null 2>&1; then
  echo "SKIPPED: no mpirun (install openmpi-bin; tools/bootstrap.sh does)"
  exit 77
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
