package lifecycle

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// inGroup reports whether a process of group pgid (members lists them)
// holds the socket at the far end of the loopback connection remote →
// local: the kernel's socket table (/proc/net/tcp, tcp6) names the
// socket's inode, and one of the members must have it open. Reading a
// member's descriptors needs the daemon's own uid or root, which is what
// nymph runs bodies as.
func inGroup(remote, local netip.AddrPort, pgid int, members func(pgid int) []int) error {
	inode, err := socketInode(remote, local)
	if err != nil {
		return err
	}
	link := "socket:[" + strconv.FormatUint(inode, 10) + "]"
	for _, pid := range members(pgid) {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // gone meanwhile, or not ours to read
		}
		for _, fd := range fds {
			if target, err := os.Readlink(dir + "/" + fd.Name()); err == nil && target == link {
				return nil
			}
		}
	}
	return fmt.Errorf("the caller's socket (inode %d) is held by no process of group %d", inode, pgid)
}

// socketInode finds, in the kernel's socket tables, the inode of the
// socket whose local address is remote and whose peer is local: the
// caller's end of the connection. An IPv4 caller's socket is in tcp, or in
// tcp6 when it is a dual-stack IPv6 socket connected to an IPv4-mapped
// address (::ffff:127.0.0.1: a JVM's default); so both tables are searched
// whatever family the listener is. An IPv6 caller's is in tcp6 only.
func socketInode(remote, local netip.AddrPort) (uint64, error) {
	tables := []string{"/proc/net/tcp", "/proc/net/tcp6"}
	if remote.Addr().Is6() {
		tables = tables[1:]
	}
	for _, table := range tables {
		inode, found, err := tableInode(table, remote, local)
		if err != nil || found {
			return inode, err
		}
	}
	return 0, fmt.Errorf("%s: no socket %s → %s", strings.Join(tables, ", "), remote, local)
}

// tableInode looks the socket remote → local up in one socket table; a
// table the kernel does not have (no IPv6) holds nothing.
func tableInode(table string, remote, local netip.AddrPort) (uint64, bool, error) {
	f, err := os.Open(table)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read %s: %w", table, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode …
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		l, err1 := parseProcAddr(fields[1])
		r, err2 := parseProcAddr(fields[2])
		if err1 != nil || err2 != nil || l != remote || r != local {
			continue
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil || inode == 0 {
			return 0, false, fmt.Errorf("%s: the caller's socket has no inode", table)
		}
		return inode, true, nil
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("read %s: %w", table, err)
	}
	return 0, false, nil
}

// parseProcAddr reads an address of /proc/net/tcp or tcp6: the IP as
// 32-bit words in host byte order, in hex, a colon, the port in hex. An
// IPv4-mapped address of tcp6 reads as the IPv4 one.
func parseProcAddr(s string) (netip.AddrPort, error) {
	ipHex, portHex, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, errors.New("no port")
	}
	raw, err := hex.DecodeString(ipHex)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", ipHex)
	}
	port, err := strconv.ParseUint(portHex, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port %q", portHex)
	}
	ip := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(ip)
	return netip.AddrPortFrom(addr.Unmap(), uint16(port)), nil
}
