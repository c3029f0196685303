# Sourced by the scripts here: podman settings this kind of host needs (see README.md).
# - runc, not crun: the host has cgroup v1 with a controller (hugetlb) on the cgroup2
#   hierarchy too ("hybrid"), which crun 1.8 refuses: "cgroups in hybrid mode not
#   supported, drop all controllers from cgroupv2".
# - ulimits no higher than the host's: root here lacks CAP_SYS_RESOURCE, and podman's
#   defaults (nofile 1048576, nproc 32768/1048576) fail with "setrlimit RLIMIT_NOFILE:
#   Operation not permitted".
WORKDIR=${WORKDIR:-/var/tmp/merlin-podman}
mkdir -p "$WORKDIR"
_nofile=$(ulimit -Hn); _nproc=$(ulimit -Hu)
[ "$_nofile" = unlimited ] && _nofile=1048576
{ [ "$_nproc" = unlimited ] || [ "$_nproc" -gt 32768 ]; } && _nproc=32768
cat > "$WORKDIR/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$_nofile:$_nofile", "nproc=$_nproc:$_nproc"]
[engine]
runtime = "${MERLIN_OCI_RUNTIME:-runc}"
CONF
export CONTAINERS_CONF=$WORKDIR/containers.conf
unset _nofile _nproc
