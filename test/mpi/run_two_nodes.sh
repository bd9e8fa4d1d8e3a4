#!/bin/sh
# Runs an MPI test binary as a job on two "nodes" of this machine: a hostfile names two
# nodes (nodeA, nodeB) of N slots each, and a stand-in for ssh (plm_rsh_agent) starts each
# node's OpenMPI daemon here. MPI then sees two nodes: ranks 0..N-1 on nodeA and N..2N-1
# on nodeB, talking over TCP on loopback (no shared memory across the "nodes").
# Usage: run_two_nodes.sh MPIEXEC N BINARY [ARGS...]
set -eu
mpiexec="$1"; n="$2"; shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
printf 'nodeA slots=%s\nnodeB slots=%s\n' "$n" "$n" >"$dir/hosts"
# Each "node" gets its own OpenMPI session directory: the daemons share this machine's
# host name, and two of them creating the same /tmp/ompi.<host>.<uid>/jf.<job> race.
cat >"$dir/agent.sh" <<AGENT
#!/bin/sh
# ssh stand-in: skips ssh's options, keeps the host name for the session directory and
# runs the command here.
while [ \$# -gt 0 ]; do case "\$1" in -*) shift;; *) break;; esac; done
host="\$1"; shift
mkdir -p "$dir/tmp-\$host"
OMPI_MCA_orte_tmpdir_base="$dir/tmp-\$host" exec sh -c "\$*"
AGENT
chmod +x "$dir/agent.sh"
export SHARDOPT_TEST_RANKS_PER_NODE="$n"
"$mpiexec" --hostfile "$dir/hosts" -n $((2 * n)) --map-by slot --bind-to none \
  --mca plm_rsh_agent "$dir/agent.sh" --mca btl self,tcp --mca btl_tcp_if_include lo \
  -x SHARDOPT_TEST_RANKS_PER_NODE -x SHARDOPT_BACKEND "$@"
