#!/usr/bin/env bash
# A real SLURM cluster of three node pairs on one machine, for the test suite and for trying launch by hand.
#
#   tests/slurm/cluster.sh install          Debian's slurm-wlm, munge, nftables, openssh, environment-modules,
#                                           podman and runc
#   tests/slurm/cluster.sh start  [STATE]   munged + slurmctld on this host, one slurmd per network namespace
#   tests/slurm/cluster.sh stop   [STATE]   every daemon, namespace and link it made, gone
#   tests/slurm/cluster.sh node-start NODE [STATE]   that node's slurmd again (after a test killed it)
#   tests/slurm/cluster.sh ssh-start [STATE]   one sshd per node (ports 22 and 2222), a key made for it
#   tests/slurm/cluster.sh ssh-stop  [STATE]   those sshd gone
#   tests/slurm/cluster.sh status [STATE]   which daemons run, and which processes hold a lease on them
#
# One cluster per machine (its addresses are fixed), shared by every process of a test run: each holds
# /run/launchsl/lease.lock shared while it may use the cluster (tests/testcluster.py). `start` and `stop`
# take that lock exclusive first, so they never end a cluster that a process is using; a caller that holds
# a lease itself hands its lock in as file descriptor CLUSTER_LEASE_FD.
#
# For the ssh tests each node also runs its own sshd (Debian's openssh-server) with a host key and a client
# key made here, in STATE/ssh; nothing of this machine's own ssh configuration is read or changed. A fifth
# namespace, the login host (10.231.77.20), runs an sshd and no slurmd: SLURM's client commands there reach
# slurmctld, as on a site's login node (the tests of submitting from a laptop through it). Each
# node's /srv is its own folder (STATE/srv-NODE, a private bind mount), so a run folder there is that host's.
#
# Each node (n1 to n7) is a network namespace with its own address on a private bridge, its own hostname (UTS
# namespace) and its own /etc/hosts (a private bind mount), so a job really spans two hosts. The nodes come in
# three pairs with partitions of their own: `debug` (the default) and `high` on n1 and n2, `debug2` and `high2`
# on n3 and n4, `debug3` and `high3` on n6 and n7 (the login host's tests), so three SLURM tests can run side by
# side, none seeing another's jobs, preemptions or failed nodes. n5 is in one partition only, `trio2` with n3 and
# n4: a job there can leave a bad node out. Clients on this
# host talk to the cluster with SLURM_CONF=STATE/slurm.conf. STATE defaults to /tmp/launch-slurm.
set -euo pipefail

STATE=${2:-/tmp/launch-slurm}
PREFIX=launchsl                # namespaces launchsl-n1 ... launchsl-n7; bridge launchsl-br
SUBNET=10.231.77               # the test hosts' own addresses, inside namespaces made here
CTL_ADDR=$SUBNET.1
NODES=(n1 n2 n3 n4 n5 n6 n7)
LOGIN=login                    # the login host: a namespace of its own with an sshd and SLURM's client commands
LOGIN_ADDR=$SUBNET.20
PAIR1=n1,n2                    # partitions debug and high
PAIR2=n3,n4                    # partitions debug2 and high2
TRIO2=n3,n4,n5                 # partition trio2: the second pair and a third node (the health gate's tests)
PAIR3=n6,n7                    # partitions debug3 and high3 (the tests through the login host)
CPUS_PER_NODE=2
PORT_CTLD=16817                # not SLURM's default ports: never confused with a real cluster's daemons
PORT_SLURMD=16818
SRUN_PORTS=61000-61999         # srun's own ports, outside the kernel's ephemeral range: a test that cuts a node's
                               # links off (nftables) lets SLURM's traffic through by its ports
# Pid files live in one fixed place, not in STATE: a run killed before its `stop` (its STATE perhaps deleted
# since) leaves daemons the next `start` must find and end. Only one test cluster runs on a machine anyway.
PIDS=/run/$PREFIX

CLAIMED=""
claim() {  # start and stop only touch a cluster nobody is using
    [ -n "$CLAIMED" ] && return 0
    mkdir -p "$PIDS"
    local fd=${CLUSTER_LEASE_FD:-}
    if [ -n "$fd" ]; then
        [[ $fd =~ ^[0-9]+$ ]] || { echo "CLUSTER_LEASE_FD: '$fd' is not a file descriptor" >&2; exit 2; }
        flock -n -x "$fd" || in_use
        eval "exec $fd>&-"  # the caller keeps the lock; the daemons started here must not hold it
    else
        exec 8>>"$PIDS/lease.lock"  # held until this script ends; its daemons get `8>&-`
        flock -n -x 8 || in_use
    fi
    CLAIMED=1
}

in_use() {
    echo "the test cluster is in use by process(es) $(lease_holders)(they hold $PIDS/lease.lock): not touching it" >&2
    exit 4
}

lease_holders() {  # pids holding a lock on lease.lock, from /proc/locks
    local inode
    inode=$(stat -c %i "$PIDS/lease.lock" 2>/dev/null) || return 0
    awk -v inode="$inode" '{ split($(NF-2), id, ":"); if (id[3] == inode) { pid = ($2 == "->") ? $6 : $5; printf "%s ", pid } }' /proc/locks
}

status() {
    local file
    for file in "$PIDS"/*.pid; do
        [ -f "$file" ] || continue
        if kill -0 "$(cat "$file")" 2>/dev/null; then echo "$(basename "$file" .pid): running"; else echo "$(basename "$file" .pid): gone"; fi
    done
    echo "leases held by: $(lease_holders)"
}

node_addr() { echo "$SUBNET.$((10 + $1))"; }   # n1 -> .11, n2 -> .12, ...

install() {
    export DEBIAN_FRONTEND=noninteractive
    # nftables: the tests' firewall rules inside one node's namespace (launch check, a network partition).
    # openssh: the ssh backend's tests (an sshd per node, the real client here).
    # environment-modules: the site's module system (`module load` in a profile's modules), on every node.
    # podman (with runc: crun refuses this machine's cgroups): the container runtime the tests run for real.
    command -v slurmctld >/dev/null && command -v munged >/dev/null && command -v nft >/dev/null \
        && [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v scp >/dev/null \
        && [ -r /usr/share/modules/init/bash ] && command -v podman >/dev/null && command -v runc >/dev/null \
        && command -v rsync >/dev/null && return 0
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge nftables openssh-server openssh-client environment-modules \
        podman runc rsync >/dev/null
}

write_config() {
    local nodes="" i
    for i in "${!NODES[@]}"; do
        nodes+="NodeName=${NODES[$i]} NodeAddr=$(node_addr $((i + 1))) CPUs=$CPUS_PER_NODE RealMemory=4000 State=UNKNOWN"$'\n'
    done
    cat >"$STATE/slurm.conf" <<EOF
ClusterName=launchtest
SlurmctldHost=$(hostname -s)($CTL_ADDR)
MailProg=/bin/true
SlurmctldPort=$PORT_CTLD
SlurmdPort=$PORT_SLURMD
SrunPortRange=$SRUN_PORTS
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket.2,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$PIDS/slurmctld.pid
SlurmdPidFile=$PIDS/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# The main scheduling pass every 5 s and backfill every 2 s (SLURM: 60 and 30), so that a job that became
# eligible without an event (a requeued job once cred_expire has passed) starts within seconds, not a minute.
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=2
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# SIGTERM to SIGKILL at a cancel or time limit (real sites: 30 s or more): the batch script's after lines run in
# it once the tasks end, which takes seconds on a busy two-core machine (5 s was too short there).
KillWait=15
MinJobAge=300
$nodes
# Real preemption: a job in "high" requeues the jobs of "debug" it needs the nodes of (and "high2" those of
# "debug2"). They get SIGTERM and GraceTime seconds to checkpoint before SIGKILL, then wait in the queue again.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName=debug Nodes=$PAIR1 Default=YES MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=high Nodes=$PAIR1 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=debug2 Nodes=$PAIR2 MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=high2 Nodes=$PAIR2 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
PartitionName=trio2 Nodes=$TRIO2 MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=OFF
PartitionName=debug3 Nodes=$PAIR3 MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=60
PartitionName=high3 Nodes=$PAIR3 MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
}

add_namespace() {  # NAME ADDRESS: a network namespace on the bridge, with that address on its eth0
    local ns="$PREFIX-$1"
    ip netns add "$ns"
    ip link add "$PREFIX-$1" type veth peer name eth0 netns "$ns"
    ip link set "$PREFIX-$1" master "$PREFIX-br" up
    ip netns exec "$ns" ip addr add "$2/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
}

start_network() {
    ip link add "$PREFIX-br" type bridge
    ip addr add "$CTL_ADDR/24" dev "$PREFIX-br"
    ip link set "$PREFIX-br" up
    local i name
    for i in "${!NODES[@]}"; do
        name=${NODES[$i]}
        add_namespace "$name" "$(node_addr $((i + 1)))"
        {
            echo "127.0.0.1 localhost"
            echo "$CTL_ADDR ctl"
            local j
            for j in "${!NODES[@]}"; do echo "$(node_addr $((j + 1))) ${NODES[$j]}"; done
        } >"$STATE/hosts-$name"
    done
    add_namespace "$LOGIN" "$LOGIN_ADDR"
    cp "$STATE/hosts-${NODES[0]}" "$STATE/hosts-$LOGIN"
    echo "$LOGIN_ADDR $LOGIN" >>"$STATE/hosts-$LOGIN"
}

start() {
    command -v slurmctld >/dev/null || { echo "slurm-wlm is not installed: $0 install" >&2; exit 3; }
    claim
    [ -e "$STATE/slurm.conf" ] && stop
    stop_leftovers
    mkdir -p "$PIDS" "$STATE"/{ctld,log,munge} "${NODES[@]/#/$STATE/spool/}"
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE/munge/munge.key"
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket.2" \
        --pid-file="$PIDS/munged.pid" --log-file="$STATE/log/munged.log" --seed-file="$STATE/munge/seed" 8>&-
    write_config
    start_network
    export SLURM_CONF=$STATE/slurm.conf
    slurmctld -f "$SLURM_CONF" 8>&-
    local name
    for name in "${NODES[@]}"; do
        start_node "$name"
    done
    wait_until_idle
}

start_node() {  # the node's slurmd (again, after a test killed it: node-start NAME [STATE])
    local name=$1
    # The node's network namespace, plus its own hostname (UTS) and /etc/hosts (a private mount), so
    # the node's processes see themselves as $name. (Not `ip netns exec`: it remounts /sys, hiding the
    # cgroup file systems slurmd needs.)
    nsenter --net="/run/netns/$PREFIX-$name" unshare --mount --uts -- sh -c \
        "mount --bind '$STATE/hosts-$name' /etc/hosts && hostname $name && exec slurmd -f '$STATE/slurm.conf' -N $name" 8>&-
}

ssh_start() {  # an sshd in every node, reachable from here with STATE/ssh/id_ed25519 as root
    [ -x /usr/sbin/sshd ] || { echo "openssh-server is not installed: $0 install" >&2; exit 3; }
    local dir=$STATE/ssh i name tries
    mkdir -p "$dir" /run/sshd "$PIDS"
    rm -f "$dir"/host_ed25519* "$dir"/id_ed25519*
    ssh-keygen -q -t ed25519 -N '' -C launch-test-host -f "$dir/host_ed25519"
    ssh-keygen -q -t ed25519 -N '' -C launch-test-client -f "$dir/id_ed25519"
    cp "$dir/id_ed25519.pub" "$dir/authorized_keys"
    chmod 600 "$dir/authorized_keys"
    : >"$dir/known_hosts"
    for i in "${!NODES[@]}"; do
        name=${NODES[$i]}
        echo "$(node_addr $((i + 1))),[$(node_addr $((i + 1)))]:2222 $(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >>"$dir/known_hosts"
        mkdir -p "$STATE/srv-$name"
        printf '%s\n' "Port 22" "Port 2222" "ListenAddress $(node_addr $((i + 1)))" "HostKey $dir/host_ed25519" \
            "AuthorizedKeysFile $dir/authorized_keys" "PermitRootLogin prohibit-password" "PasswordAuthentication no" \
            "KbdInteractiveAuthentication no" "UsePAM no" "StrictModes no" \
            "Subsystem sftp /usr/lib/openssh/sftp-server" "PidFile $PIDS/sshd-$name.pid" >"$dir/sshd_config-$name"
        stop_pid "$PIDS/sshd-$name.pid"
        nsenter --net="/run/netns/$PREFIX-$name" unshare --mount --uts -- sh -c \
            "mount --bind '$STATE/hosts-$name' /etc/hosts && mount --bind '$STATE/srv-$name' /srv && hostname $name && exec /usr/sbin/sshd -f '$dir/sshd_config-$name' -E '$STATE/log/sshd-$name.log'" 8>&-
    done
    # The login host: SLURM's client commands reach slurmctld with the cluster's slurm.conf (SetEnv), as a site's
    # login node does with its /etc/slurm; it runs no slurmd. STATE/login-bin comes first on its PATH (empty: a test
    # may put a command there that stands in front of SLURM's).
    mkdir -p "$STATE/login-bin"
    echo "$LOGIN_ADDR $(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >>"$dir/known_hosts"
    printf '%s\n' "Port 22" "ListenAddress $LOGIN_ADDR" "HostKey $dir/host_ed25519" "AuthorizedKeysFile $dir/authorized_keys" \
        "PermitRootLogin prohibit-password" "PasswordAuthentication no" "KbdInteractiveAuthentication no" "UsePAM no" \
        "StrictModes no" "MaxStartups 100" "SetEnv SLURM_CONF=$STATE/slurm.conf PATH=$STATE/login-bin:/usr/local/bin:/usr/bin:/bin" "PidFile $PIDS/sshd-$LOGIN.pid" \
        >"$dir/sshd_config-$LOGIN"
    stop_pid "$PIDS/sshd-$LOGIN.pid"
    nsenter --net="/run/netns/$PREFIX-$LOGIN" unshare --mount --uts -- sh -c \
        "mount --bind '$STATE/hosts-$LOGIN' /etc/hosts && hostname $LOGIN && exec /usr/sbin/sshd -f '$dir/sshd_config-$LOGIN' -E '$STATE/log/sshd-$LOGIN.log'" 8>&-
    local addr
    for addr in $(for i in "${!NODES[@]}"; do node_addr $((i + 1)); done) "$LOGIN_ADDR"; do  # up once it answers
        for tries in $(seq 1 40); do
            ssh -i "$dir/id_ed25519" -o IdentitiesOnly=yes -o UserKnownHostsFile="$dir/known_hosts" \
                -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=2 "root@$addr" true \
                2>/dev/null && break
            [ "$tries" = 40 ] && { echo "sshd on $addr did not come up; logs in $STATE/log" >&2; exit 1; }
            sleep 0.25
        done
    done
    echo "sshd up on ${NODES[*]} $LOGIN: ssh -i $dir/id_ed25519 -o UserKnownHostsFile=$dir/known_hosts root@$(node_addr 1)"
}

ssh_stop() {
    local name
    for name in "${NODES[@]}" "$LOGIN"; do stop_pid "$PIDS/sshd-$name.pid"; done
}

wait_until_idle() {
    local tries
    for tries in $(seq 1 60); do
        # A node is listed once per partition: count each node once.
        if [ "$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u | grep -c ' idle$')" = "${#NODES[@]}" ]; then
            echo "SLURM test cluster up: SLURM_CONF=$STATE/slurm.conf (${NODES[*]})"
            return 0
        fi
        sleep 0.5
    done
    echo "SLURM test cluster did not come up; logs in $STATE/log" >&2
    sinfo -N >&2 || true
    tail -n 20 "$STATE"/log/*.log >&2 || true
    return 1
}

stop_pid() {  # daemons by their pid files: TERM to all at once, then KILL to those that linger
    local file pid pids=() alive
    for file in "$@"; do [ -f "$file" ] && pids+=("$(cat "$file")"); done
    [ ${#pids[@]} -gt 0 ] || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 1 20); do
        alive=""
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ -n "$alive" ] || break
        sleep 0.25
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
    rm -f "$@"
}

stop() {
    claim
    # Jobs first: stopped daemons would leave their processes behind.
    if [ -f "$STATE/slurm.conf" ]; then
        SLURM_CONF=$STATE/slurm.conf scancel --full --quiet "--user=$(id -un)" 2>/dev/null || true
        sleep 1
    fi
    stop_leftovers quiet
    rm -rf "$STATE"
}

stop_leftovers() {  # every daemon, namespace and link of a test cluster, whichever STATE started it
    local name ns pid found="" daemons=()
    for name in "${NODES[@]}"; do daemons+=("$PIDS/slurmd-$name.pid" "$PIDS/sshd-$name.pid"); done
    daemons+=("$PIDS/slurmctld.pid" "$PIDS/sshd-$LOGIN.pid")
    for name in "${daemons[@]}"; do [[ -f $name && $name != *sshd* ]] && found=1; done
    stop_pid "${daemons[@]}"
    stop_pid "$PIDS/munged.pid"  # last: slurmctld and slurmd talk through it until they end
    for name in "${NODES[@]}" "$LOGIN"; do
        ns="$PREFIX-$name"
        # Anything still running in the node (a job step's processes) goes with it.
        if ip netns list | grep -qw "$ns"; then
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns del "$ns"
        fi
        ip link del "$PREFIX-$name" 2>/dev/null || true
    done
    ip link del "$PREFIX-br" 2>/dev/null && found=1
    [ -n "$found" ] && [ "${1:-}" != quiet ] && echo "ended a test cluster's leftover daemons and namespaces" >&2
    return 0
}

case ${1:-} in
    install) install ;;
    start) start ;;
    stop) stop ;;
    node-start) STATE=${3:-/tmp/launch-slurm}; start_node "$2" ;;
    ssh-start) ssh_start ;;
    ssh-stop) ssh_stop ;;
    status) status ;;
    *) echo "usage: $0 install|start|stop|ssh-start|ssh-stop|status [STATE_DIR] | node-start NODE [STATE_DIR]" >&2; exit 2 ;;
esac
