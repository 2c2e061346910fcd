package events

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var updateFuzzCorpus = flag.Bool("update-fuzz-corpus", false, "rewrite testdata/fuzz/FuzzReader from fuzzSeeds")

// FuzzReader feeds arbitrary bytes to the reader. It must never panic, must
// fail only with the package's errors, and whatever it reads must survive
// being written and read again unchanged. Random bytes rarely get past the
// block checksums, so each input is also read with its checksums repaired,
// which lets the fuzzer explore the record decoders.
func FuzzReader(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(seed.data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkReadable(t, data)
		if repaired := repairChecksums(data); !bytes.Equal(repaired, data) {
			checkReadable(t, repaired)
		}
	})
}

func checkReadable(t *testing.T, data []byte) {
	recs, err := decodeAll(data)
	var corrupt *CorruptError
	switch {
	case err == io.EOF, errors.Is(err, ErrTruncated):
	case errors.Is(err, ErrNotTrace), errors.Is(err, ErrVersion):
		return
	case errors.As(err, &corrupt):
		if corrupt.Offset < 0 || corrupt.Offset > int64(len(data)) {
			t.Fatalf("corruption reported at offset %d of a %d-byte file", corrupt.Offset, len(data))
		}
		return
	default:
		t.Fatalf("unexpected error: %v", err)
	}

	var buf bytes.Buffer
	w := NewWriter(&buf)
	for i := range recs {
		if err := w.Write(&recs[i]); err != nil {
			t.Fatalf("writing back record %d (%s): %v", i, describe(recs[i]), err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	again, err2 := decodeAll(buf.Bytes())
	if (err == io.EOF) != (err2 == io.EOF) || (err2 != io.EOF && !errors.Is(err2, ErrTruncated)) {
		t.Fatalf("read ended with %v, but with %v once written back", err, err2)
	}
	if len(again) != len(recs) {
		t.Fatalf("read %d records, but %d once written back", len(recs), len(again))
	}
	for i := range recs {
		if !reflect.DeepEqual(again[i], recs[i]) {
			t.Fatalf("record %d changed when written back:\n was %s\n now %s", i, describe(recs[i]), describe(again[i]))
		}
	}
}

// repairChecksums returns data with the checksums of its whole blocks
// recomputed.
func repairChecksums(data []byte) []byte {
	out := bytes.Clone(data)
	for off := preambleSize; off+blockHeaderSize <= len(out); {
		h := out[off : off+blockHeaderSize]
		n := int(binary.LittleEndian.Uint32(h))
		end := off + blockHeaderSize + n
		if n > maxBlock || end > len(out) {
			binary.LittleEndian.PutUint32(h[8:], crc32c(h[:8]))
			break
		}
		putBlockHeader(h, out[off+blockHeaderSize:end])
		off = end
	}
	return out
}

// lastBlock returns the offset of the last block of a sound trace file.
func lastBlock(data []byte) int {
	last := preambleSize
	for off := preambleSize; off < len(data); off += blockHeaderSize + int(binary.LittleEndian.Uint32(data[off:])) {
		last = off
	}
	return last
}

type fuzzSeed struct {
	name string
	data []byte
}

// fuzzSeeds are small traces of every record kind, whole, cut short and
// damaged.
func fuzzSeeds() []fuzzSeed {
	recs := wrap(
		stack(&Stack{ID: 1, Truncated: true, Frames: []Frame{
			{Addr: 0x401000, Function: "main", Offset: 16, File: "main.c", Line: 3, Object: "/bin/app"},
			{Addr: 0x401200, Function: "work", Offset: 4, File: "main.c", Line: 9, Object: "/bin/app"},
		}}),
		Record{Kind: RecThread, Thread: Thread{PID: 1, TID: 2, Name: "worker"}},
		ev(Event{Time: 100, PID: 1, TID: 1, Op: OpMalloc, Size: 32, Ret: 0x55000010, Stack: 1}),
		ev(Event{Time: 150, PID: 1, TID: 2, Op: OpMutexLock, Flags: FlagAcquired, Addr: 0x601040, Arg: 1, Stack: 1}),
		ev(Event{Time: 160, PID: 1, TID: 2, Op: OpCondWait, Addr: 0x601080, Addr2: 0x601040}),
		ev(Event{Time: 170, PID: 1, TID: 2, Op: OpMutexTrylock, Flags: FlagReturn | FlagInAlloc, Addr: 0x601040, Addr2: uint64(OpMalloc), Ret: -16}),
		ev(Event{Time: 180, PID: 1, TID: 2, Op: OpProbeExit, Arg: 2}),
		ev(Event{Time: 190, PID: 1, TID: 1, Op: Op(300)}),
		Record{Kind: RecLockName, LockName: LockName{PID: 1, Addr: 0x601040, Name: "big_lock (app)"}},
		ev(Event{Time: 200, PID: 1, TID: 1, Op: OpFree, Addr: 0x55000010, Size: 48, Stack: 1}),
		Record{Kind: RecLost, Lost: Lost{Time: 250, Count: 2}},
	)
	// Small JSON records leave the fuzzer more of the binary ones to mutate.
	full := recs[0]
	exit := 1
	recs[0] = Record{Kind: RecHeader, Header: &Header{Tool: "hooktrace", PID: 1}}
	recs[len(recs)-1] = Record{Kind: RecFooter, Footer: &Footer{Events: 7, ExitStatus: &exit}}
	write := func(flushEvery int, recs []Record) []byte {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		for i := range recs {
			if err := w.Write(&recs[i]); err != nil {
				panic(err)
			}
			if flushEvery > 0 && i%flushEvery == flushEvery-1 {
				if err := w.Flush(); err != nil {
					panic(err)
				}
			}
		}
		if err := w.Close(); err != nil {
			panic(err)
		}
		return buf.Bytes()
	}
	whole := write(0, recs)
	blocks := write(3, recs)
	flip := func(b []byte, bit int) []byte {
		b = bytes.Clone(b)
		b[bit/8] ^= 1 << (bit % 8)
		return b
	}
	// A payload byte changed with the checksums repaired: sound blocks
	// holding a bad record.
	badRecord := repairChecksums(flip(whole, 8*(preambleSize+blockHeaderSize+40)+3))
	return []fuzzSeed{
		{"whole", whole},
		{"blocks", blocks},
		{"full-header", write(0, []Record{full})},
		{"truncated-mid-block", blocks[:len(blocks)-7]},
		{"truncated-at-block", blocks[:lastBlock(blocks)]},
		{"truncated-preamble", whole[:5]},
		{"bit-flip", flip(blocks, 8*(len(blocks)/2))},
		{"bad-record", badRecord},
		{"future-version", flip(whole, 8*len(fileMagic)+1)},
		{"not-a-trace", []byte("hello, world\n")},
		{"empty", nil},
	}
}

// TestFuzzCorpus keeps the checked-in seed corpus in step with fuzzSeeds:
// run with -update-fuzz-corpus after changing the format.
func TestFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzReader")
	for _, seed := range fuzzSeeds() {
		path := filepath.Join(dir, seed.name)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", seed.data)
		if *updateFuzzCorpus {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run go test -run TestFuzzCorpus -update-fuzz-corpus)", err)
		}
		if string(got) != want {
			t.Errorf("%s is out of date (run go test -run TestFuzzCorpus -update-fuzz-corpus)", path)
		}
	}
}
