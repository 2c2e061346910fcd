//go:build linux && amd64

package symbolize

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string // "r-xp"
	Offset     uint64 // file offset of Start
	Major      uint32
	Minor      uint32
	Inode      uint64
	// Path is the mapped file, a pseudo-path such as "[heap]" or "[vdso]",
	// or empty for anonymous memory. A " (deleted)" suffix is removed and
	// reported in Deleted instead.
	Path    string
	Deleted bool
}

// IsFile reports whether m maps a file (as opposed to anonymous memory or a
// kernel-provided area such as [vdso]).
func (m Mapping) IsFile() bool {
	return m.Inode != 0 && strings.HasPrefix(m.Path, "/")
}

// Executable reports whether m's pages may be executed.
func (m Mapping) Executable() bool { return len(m.Perms) > 2 && m.Perms[2] == 'x' }

// Contains reports whether addr lies in m.
func (m Mapping) Contains(addr uint64) bool { return addr >= m.Start && addr < m.End }

// Maps is a process's address space, sorted by address.
type Maps []Mapping

// ErrSpaceEnded is ReadMaps' error when the address space it read ended
// (its process exited or exec'd) before the read was known to be whole.
var ErrSpaceEnded = errors.New("its address space ended while it was read")

// ReadMaps reads /proc/PID/maps. The file stays on the address space it
// was opened on, and the kernel hands it out a page or so per read(2),
// each read taking that address space anew: one that ends in between
// (the process exits or execs) ends the file there, and what was read is
// a truncated list, not the process's mappings. So once the file is read
// it is read again from its start: a space still there then was there
// for every earlier read, and the list is whole; otherwise ReadMaps fails
// with ErrSpaceEnded (a zombie's maps, empty, are that too).
func ReadMaps(pid int) (Maps, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("reading maps of pid %d: %w", pid, err)
	}
	defer f.Close()
	maps, err := readMaps(f)
	if err != nil {
		return nil, fmt.Errorf("reading maps of pid %d: %w", pid, err)
	}
	return maps, nil
}

// readMaps reads an open /proc/PID/maps.
func readMaps(f io.ReadSeeker) (Maps, error) {
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	var one [1]byte
	if n, err := f.Read(one[:]); n == 0 {
		if err != nil && err != io.EOF {
			return nil, err
		}
		return nil, ErrSpaceEnded
	}
	return ParseMaps(bytes.NewReader(data))
}

// exited reports whether pid has ended: reaped, a zombie, or dead.
func exited(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH)
	}
	// The state follows the command name, which may hold anything but
	// ends at the last parenthesis.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	return stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// ParseMaps parses the /proc/PID/maps format.
func ParseMaps(r io.Reader) (Maps, error) {
	var maps Maps
	sc := bufio.NewScanner(r)
	// A path can be up to PATH_MAX long, more than Scanner's default line.
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := parseMapsLine(line)
		if err != nil {
			return nil, fmt.Errorf("parsing maps line %d %q: %w", n, line, err)
		}
		maps = append(maps, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading maps: %w", err)
	}
	sort.Slice(maps, func(i, j int) bool { return maps[i].Start < maps[j].Start })
	return maps, nil
}

// parseMapsLine parses "start-end perms offset major:minor inode   path".
// The path is everything after the inode and its padding, so it may hold
// spaces; the kernel escapes only newlines in it (as \012).
func parseMapsLine(line string) (Mapping, error) {
	var m Mapping
	rest := line
	field := func() string {
		rest = strings.TrimLeft(rest, " ")
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			f := rest
			rest = ""
			return f
		}
		f := rest[:i]
		rest = rest[i+1:]
		return f
	}
	addrs, perms, offset, dev, inode := field(), field(), field(), field(), field()

	start, end, ok := strings.Cut(addrs, "-")
	if !ok {
		return m, fmt.Errorf("bad address range %q", addrs)
	}
	var err error
	if m.Start, err = strconv.ParseUint(start, 16, 64); err != nil {
		return m, fmt.Errorf("parsing start: %w", err)
	}
	if m.End, err = strconv.ParseUint(end, 16, 64); err != nil {
		return m, fmt.Errorf("parsing end: %w", err)
	}
	if len(perms) != 4 {
		return m, fmt.Errorf("bad permissions %q", perms)
	}
	m.Perms = perms
	if m.Offset, err = strconv.ParseUint(offset, 16, 64); err != nil {
		return m, fmt.Errorf("parsing offset: %w", err)
	}
	major, minor, ok := strings.Cut(dev, ":")
	if !ok {
		return m, fmt.Errorf("bad device %q", dev)
	}
	maj, err := strconv.ParseUint(major, 16, 32)
	if err != nil {
		return m, fmt.Errorf("parsing device major: %w", err)
	}
	mnr, err := strconv.ParseUint(minor, 16, 32)
	if err != nil {
		return m, fmt.Errorf("parsing device minor: %w", err)
	}
	m.Major, m.Minor = uint32(maj), uint32(mnr)
	if m.Inode, err = strconv.ParseUint(inode, 10, 64); err != nil {
		return m, fmt.Errorf("parsing inode: %w", err)
	}

	path := strings.TrimLeft(rest, " ")
	if p, ok := strings.CutSuffix(path, " (deleted)"); ok && m.Inode != 0 {
		path, m.Deleted = p, true
	}
	m.Path = strings.ReplaceAll(path, `\012`, "\n")
	return m, nil
}

// find returns the index of the mapping holding addr, or -1.
func (ms Maps) find(addr uint64) int {
	i := sort.Search(len(ms), func(i int) bool { return ms[i].End > addr })
	if i < len(ms) && ms[i].Contains(addr) {
		return i
	}
	return -1
}

// Find returns the mapping holding addr.
func (ms Maps) Find(addr uint64) (Mapping, bool) {
	if i := ms.find(addr); i >= 0 {
		return ms[i], true
	}
	return Mapping{}, false
}

// openMapped opens the file m maps in process pid. It prefers the kernel's
// own handles on the mapping, which work for files deleted or replaced since
// they were mapped and for files inside another mount namespace, then falls
// back to the path seen from the process's root and finally from ours.
// Path-based candidates must have the inode the mapping names, so a file
// rebuilt in place is not mistaken for the one still mapped.
func openMapped(pid int, m Mapping) (*os.File, error) {
	if pid > 0 {
		if f, err := os.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.Start, m.End)); err == nil {
			return f, nil
		}
		// The executable stays reachable through /proc/PID/exe without the
		// privileges map_files needs, even after it was deleted.
		exe := fmt.Sprintf("/proc/%d/exe", pid)
		if target, err := os.Readlink(exe); err == nil && strings.TrimSuffix(target, " (deleted)") == m.Path {
			if f, err := openInode(exe, m.Inode); err == nil {
				return f, nil
			}
		}
		if f, err := openInode(fmt.Sprintf("/proc/%d/root%s", pid, m.Path), m.Inode); err == nil {
			return f, nil
		}
	}
	f, err := openInode(m.Path, m.Inode)
	if err != nil {
		return nil, fmt.Errorf("opening %s mapped by pid %d: %w", m.Path, pid, err)
	}
	return f, nil
}

// openInode opens path if it is still the file with the given inode.
func openInode(path string, inode uint64) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if inode != 0 {
		if ino, _, ok := fileIdentity(f); ok && ino != inode {
			f.Close()
			return nil, fmt.Errorf("%s is no longer the mapped file (inode %d, mapped %d)", path, ino, inode)
		}
	}
	return f, nil
}

// DropObject drops the PCs in the object at path (the recorder's own
// library in the target). A walk that ends in it reached the recorder's
// thread start wrapper: the target's part of the stack is whole.
func (ms Maps) DropObject(pcs []uint64, complete bool, path string) ([]uint64, bool) {
	out := pcs[:0]
	for i, pc := range pcs {
		if m, ok := ms.Find(pc); ok && m.Path == path {
			if i == len(pcs)-1 {
				complete = true
			}
			continue
		}
		out = append(out, pc)
	}
	return out, complete
}
