#!/bin/bash
# inside.sh WORK: the checks one kernel of the matrix runs, inside its VM
# (run.sh), from the repository's root. WORK holds the hooktrace binary
# and cmd/hooktrace's compiled tests. Every check must pass; CI is set, so
# a test that needs eBPF fails where it is missing instead of skipping.
set -u
work=$1
export CI=1 HOOKTRACE_TEST_BIN=$work/hooktrace
echo "kernel $(uname -r)"
failed=
check() {
	local name=$1
	shift
	local start=$(date +%s)
	echo "--- $name"
	if (cd cmd/hooktrace && "$work/cmd.test" -test.count=1 -test.timeout=15m "$@"); then
		echo "--- ok   $name ($(($(date +%s) - start))s)"
	else
		echo "--- FAIL $name ($(($(date +%s) - start))s)"
		failed="$failed $name"
	fi
}

# The eBPF recorder: an inversion (and auto, with the syscall tracepoint),
# and the registration cache's seed case, the legacy cache's cycle through
# vma_lock and glibc's arena lock.
HOOKTRACE_EXPECT_EBPF=loads check ebpf-inversion -test.run '^TestAutoWhereEBPFCannotLoad$'
check ebpf-rcache -test.run '^TestDemo$/^ebpf$'
# Probes on the calls of the lock functions whose entries are
# single-stepped: one uprobe_multi link an object on 6.6 and later, one
# perf-event uprobe a call before; from the start and in a library
# loaded later, with the stacks and counts of the preloaded recorder.
check call-sites -test.run '^TestCallSiteProbes'
# attach: to a running program (the probes placed in a live process), and
# to a deadlocked one (found by its threads' samples, eBPF loaded or not).
check attach-running -test.run '^TestAttachLeavesTargetRight$'
check attach-deadlocked -test.run '^TestAttachHungProcess$/^abba$'

# A kernel that cannot run the probes: lockdown=confidentiality withdraws
# bpf_probe_read_kernel and bpf_probe_read_user, which they call; the
# start-up check finds them missing before anything loads.
# Lockdown cannot be lifted: this comes last.
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
if echo confidentiality >/sys/kernel/security/lockdown; then
	HOOKTRACE_EXPECT_EBPF=fails check auto-fallback -test.run '^TestAutoWhereEBPFCannotLoad$' -test.v
else
	echo "--- FAIL auto-fallback: cannot lock the kernel down"
	failed="$failed auto-fallback"
fi

if [ -n "$failed" ]; then
	echo "failed on $(uname -r):$failed"
	exit 1
fi
echo "all passed on $(uname -r)"
