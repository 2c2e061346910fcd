package main

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hooktrace/hooktrace/events"
)

// rankVars are where MPI launchers put a process's rank, first found wins:
// Open MPI (mpirun), PMI (MPICH, Intel MPI, srun --mpi=pmi2), PMIx, Slurm.
var rankVars = []string{"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}

// expandOutputPath fills in a file name given to -o or --report, so that
// every process of a parallel job writes its own:
//
//	%p  the traced process's PID
//	%h  the host name
//	%r  the rank (OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK or SLURM_PROCID;
//	    0 for a UPC++/GASNet smp job's first process, GASNET_PSHM_NODES set)
//	%t  the start time, UTC, 20060102T150405Z
//	%%  a percent sign
func expandOutputPath(pattern string, h *events.Header) (string, error) {
	return expandPath(pattern, h, os.Getenv)
}

func expandPath(pattern string, h *events.Header, getenv func(string) string) (string, error) {
	if !strings.Contains(pattern, "%") {
		return pattern, nil
	}
	var b strings.Builder
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		if i+1 == len(pattern) {
			return "", usageError{fmt.Errorf("%q: a lone %% at the end (write %%%% for a percent sign)", pattern)}
		}
		i++
		switch pattern[i] {
		case 'p':
			b.WriteString(strconv.FormatUint(uint64(h.PID), 10))
		case 'h':
			host := h.Host
			if host == "" {
				host, _ = os.Hostname()
			}
			if i := strings.IndexByte(host, '.'); i > 0 {
				host = host[:i]
			}
			b.WriteString(sanitizeName(host))
		case 'r':
			b.WriteString(rankOf(getenv))
		case 't':
			start := time.Now()
			if h.StartUnix > 0 {
				start = time.Unix(0, h.StartUnix)
			}
			b.WriteString(start.UTC().Format("20060102T150405Z"))
		case '%':
			b.WriteByte('%')
		default:
			return "", usageError{fmt.Errorf("%q: unknown %%%c (want %%p, %%h, %%r, %%t or %%%%)", pattern, pattern[i])}
		}
	}
	return b.String(), nil
}

// rankOf is the process's rank: what an MPI launcher put in the
// environment; 0 in a UPC++/GASNet smp job (GASNET_PSHM_NODES), where the
// process upcxx-run starts is rank 0 and forks the others into the same
// trace (the footer says which process was which rank); "0" with a warning
// outside a parallel launcher.
func rankOf(getenv func(string) string) string {
	if r, ok := envRank(getenv); ok {
		return strconv.Itoa(r)
	}
	if getenv("GASNET_PSHM_NODES") != "" {
		return "0"
	}
	slog.Warn("%r in a file name, but no rank in the environment (" + strings.Join(rankVars, ", ") + ", GASNET_PSHM_NODES): using 0")
	return "0"
}

// sanitizeName keeps a host name usable in a file name.
func sanitizeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, s)
}
