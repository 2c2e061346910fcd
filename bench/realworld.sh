#!/usr/bin/env bash
# make realworld: software nobody here wrote, traced as its users would trace
# it. Builds libuv's and jemalloc's test suites from the source checkouts
# given, runs each suite untraced and under hooktrace, and prints a Markdown
# summary: tests, outcomes (and which changed), findings by kind, traces
# that lost events, and the wall-time cost. Before a release, not in CI.
#
#   make realworld LIBUV_SRC=~/src/libuv JEMALLOC_SRC=~/src/jemalloc
#
# Knobs (environment):
#   LIBUV_SRC, JEMALLOC_SRC  source checkouts; an unset one is skipped
#   RECORDERS       recorders to run each suite under (default: preload, and
#                   ebpf too as root); libuv's suite refuses root, so it runs
#                   as nobody, under preload only
#   WORK            where to build and keep the reports (default: a new
#                   temporary directory, kept and printed)
#   JOBS            build parallelism (default: nproc)
#   LIBUV_TESTS     libuv test names to run instead of the whole suite
#   JEMALLOC_TESTS  an extended regular expression that jemalloc test paths
#                   (test/unit/a0, ...) must match (default: unit and
#                   integration tests; test/stress/ are benchmarks)
#   HOOKTRACE       the hooktrace binary (default: bin/hooktrace)
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
HOOKTRACE=${HOOKTRACE:-$repo/bin/hooktrace}
JOBS=${JOBS:-$(nproc)}
WORK=${WORK:-$(mktemp -d /tmp/hooktrace-realworld.XXXXXX)}
if [ -z "${RECORDERS:-}" ]; then
	RECORDERS=preload
	[ "$(id -u)" = 0 ] && RECORDERS="preload ebpf"
fi
[ -n "${LIBUV_SRC:-}${JEMALLOC_SRC:-}" ] || {
	echo "realworld: set LIBUV_SRC and/or JEMALLOC_SRC to source checkouts" >&2
	exit 2
}
mkdir -p "$WORK"
chmod 755 "$WORK"
echo "realworld: building and running in $WORK" >&2

# copy SRC DEST: a source checkout without its git history.
copy() {
	rm -rf "$2"
	mkdir -p "$2"
	(cd "$1" && tar --exclude=.git -cf - .) | (cd "$2" && tar -xf -)
}

# The wrapper every test runs through: NAME is the suite's, the rest is the
# test's command. It appends "test status seconds" to $OUT/results and runs
# the test under hooktrace when $RECORDER is set, with its JSON report in
# $OUT/reports.
cat >"$WORK/wrap.sh" <<'EOF'
#!/bin/sh
t=$1
shift
name=$(printf '%s' "$t" | tr '/ ' '__')
start=$(date +%s.%N)
if [ -n "$RECORDER" ]; then
	"$HOOKTRACE" run --recorder "$RECORDER" --follow-forks --fail-on none \
		--report "json:$OUT/reports/$name.json" -- "$@" 2>>"$OUT/hooktrace.log"
else
	"$@"
fi
rc=$?
end=$(date +%s.%N)
echo "$t $rc $(echo "$end - $start" | bc)" >>"$OUT/results"
exit $rc
EOF
chmod 755 "$WORK/wrap.sh"
export HOOKTRACE

# outdir SUITE RECORDER: a fresh directory for one run's results.
outdir() {
	local d="$WORK/runs/$1-${2:-untraced}"
	rm -rf "$d"
	mkdir -p "$d/reports"
	chmod -R 777 "$d"
	echo "$d"
}

libuv() {
	local src="$WORK/libuv"
	copy "$LIBUV_SRC" "$src"
	cmake -S "$src" -B "$src/build" -DBUILD_TESTING=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$WORK/libuv-build.log" 2>&1
	cmake --build "$src/build" -j "$JOBS" --target uv_run_tests_a >>"$WORK/libuv-build.log" 2>&1
	chown -R nobody "$src" 2>/dev/null || true
	local recorders=untraced r
	for r in $RECORDERS; do [ "$r" = preload ] && recorders="$recorders preload"; done
	# The whole suite in one process tree under one hooktrace, as a user
	# traces a test runner; each test's outcome from the runner's TAP.
	for r in $recorders; do
		local out
		out=$(outdir libuv "${r#untraced}")
		local rec=${r#untraced}
		local args=(build/uv_run_tests_a)
		[ -n "${LIBUV_TESTS:-}" ] && args=(sh -c 'for t; do build/uv_run_tests_a "$t"; done; true' sh $LIBUV_TESTS)
		echo "realworld: libuv, ${r}" >&2
		(cd "$src" && env OUT="$out" RECORDER="$rec" UV_TEST_TIMEOUT_MULTIPLIER=4 \
			runuser -u nobody -- "$WORK/wrap.sh" suite "${args[@]}" >"$out/tap" 2>&1) || true
		# TAP: "ok N - name" / "not ok N - name # reason".
		sed -n 's/^\(not ok\|ok\) [0-9]* - \([^ ]*\).*/\2 \1/p' "$out/tap" |
			sed 's/ not ok$/ fail/; s/ ok$/ pass/' | while read -r name res; do
			if grep -q "^ok [0-9]* - $name # SKIP" "$out/tap"; then res=skip; fi
			echo "$name $res"
		done >"$out/outcomes"
	done
}

jemalloc() {
	local src="$WORK/jemalloc"
	copy "$JEMALLOC_SRC" "$src"
	(cd "$src" && ./autogen.sh --enable-debug && make -j "$JOBS" && make -j "$JOBS" tests) >"$WORK/jemalloc-build.log" 2>&1
	local tests
	tests=$(cd "$src" && grep -o '$(srcroot)test/[a-z]*/[A-Za-z0-9_/]*\.c' Makefile | sed 's/^$(srcroot)//; s/\.c$//' |
		grep -E "${JEMALLOC_TESTS:-^test/(unit|integration)/}" | while read -r t; do [ -x "$t" ] && echo "$t"; done)
	for r in untraced $RECORDERS; do
		local out
		out=$(outdir jemalloc "${r#untraced}")
		echo "realworld: jemalloc, $r" >&2
		# Their own harness, with every test run through the wrapper; it
		# sets each test's MALLOC_CONF from test/*/NAME.sh.
		local t
		for t in $tests; do
			(cd "$src" && env OUT="$out" RECORDER="${r#untraced}" JEMALLOC_TEST_PREFIX="$WORK/wrap.sh $t" \
				sh test/test.sh "$t" >>"$out/log" 2>&1) || true
		done
		awk '{print $1, ($2 == 0 ? "pass" : $2 == 1 ? "skip" : "fail")}' "$out/results" >"$out/outcomes"
	done
}

[ -n "${LIBUV_SRC:-}" ] && libuv
[ -n "${JEMALLOC_SRC:-}" ] && jemalloc
python3 "$repo/bench/realworld_summary.py" "$WORK/runs"
echo "realworld: reports in $WORK/runs" >&2
