package main

import (
	"maps"
	"testing"

	"github.com/hooktrace/hooktrace/events"
)

func forkRecord(parent, child uint32) *events.Record {
	return &events.Record{Kind: events.RecEvent, Event: events.Event{PID: parent, TID: parent,
		Op: events.OpThreadCreate, Flags: events.FlagProcess, Arg: uint64(child)}}
}

// TestJobRanks: a GASNet smp job's rank 0 forks the other ranks, numbered
// by fork order; a fork beyond the job's size, or by another process, is
// no rank; a launcher's rank in the environment is the root's.
func TestJobRanks(t *testing.T) {
	env := map[string]string{"GASNET_PSHM_NODES": "3"}
	j := newJobRanks(func(k string) string { return env[k] })
	for _, r := range []*events.Record{forkRecord(10, 11), forkRecord(11, 20), forkRecord(10, 12), forkRecord(10, 13)} {
		j.observe(r)
	}
	if got, want := j.ranks(10), map[uint32]int{10: 0, 11: 1, 12: 2}; !maps.Equal(got, want) {
		t.Errorf("smp: %v, want %v", got, want)
	}
	env = map[string]string{"OMPI_COMM_WORLD_RANK": "5"}
	if got, want := newJobRanks(func(k string) string { return env[k] }).ranks(7), map[uint32]int{7: 5}; !maps.Equal(got, want) {
		t.Errorf("mpirun: %v, want %v", got, want)
	}
	env = map[string]string{}
	if got := newJobRanks(func(k string) string { return env[k] }).ranks(7); got != nil {
		t.Errorf("no job: %v", got)
	}
}
