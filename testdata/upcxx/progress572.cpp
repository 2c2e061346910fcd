// The shape of UPC++ issue 572, with the real runtime: verify_segment is
// meant to make internal-level progress only, but waits on a future with
// future::wait(), which makes user-level progress and may run an incoming
// RPC before the segment it checks is registered. Rank 1 sends rank 0
// RPCs before it answers. With "fixed", verify_segment makes internal-level
// progress only and returns the future, which its caller waits on once the
// segment is ready: the RPCs run then.
//
// Built with: upcxx -g progress572.cpp -o progress572
#include <upcxx/upcxx.hpp>

#include <cstdio>
#include <cstring>

static int rpcs_run, early;
static bool segment_ready;

static void on_incoming_rpc(int n) {
	// What crashed in issue 572: the RPC uses the segment.
	if (!segment_ready) {
		std::fprintf(stderr, "rank %d: rpc %d ran before the segment was ready\n", upcxx::rank_me(), n);
		early++;
	}
	rpcs_run++;
}

// Progress level: internal (by its documentation). It checks the
// segment with a round trip to the other rank.
__attribute__((noinline)) upcxx::future<int> verify_segment(upcxx::global_ptr<int> seg, bool fixed) {
	upcxx::future<int> f = upcxx::rpc(
	    1,
	    [](upcxx::global_ptr<int> p) {
		    // Rank 1 has RPCs of its own for rank 0, sent before the
		    // reply: rank 0 sees them first.
		    for (int i = 0; i < 4; i++)
			    upcxx::rpc_ff(0, on_incoming_rpc, i);
		    return int(p.is_null());
	    },
	    seg);
	if (fixed) {
		upcxx::progress(upcxx::progress_level::internal);
		return f;
	}
	f.wait();
	segment_ready = true;
	return f;
}

int main(int argc, char **argv) {
	bool fixed = argc > 1 && std::strcmp(argv[1], "fixed") == 0;
	upcxx::init();
	if (upcxx::rank_n() != 2) {
		if (upcxx::rank_me() == 0)
			std::fprintf(stderr, "run with 2 ranks\n");
		upcxx::finalize();
		return 2;
	}
	upcxx::global_ptr<int> seg = upcxx::new_array<int>(16);
	upcxx::barrier();
	if (upcxx::rank_me() == 0) {
		upcxx::future<int> f = verify_segment(seg, fixed);
		segment_ready = true;
		f.wait();
	}
	upcxx::barrier();
	upcxx::barrier();
	if (upcxx::rank_me() == 0)
		std::printf("rank 0: rpcs %d, early %d\n", rpcs_run, early);
	upcxx::delete_array(seg);
	upcxx::finalize();
	return 0;
}
