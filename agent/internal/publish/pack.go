package publish

import (
	"archive/tar"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"syscall"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// errTooLarge stops a pack that went past Config.MaxBytes.
var errTooLarge = errors.New("over the size limit")

// limitWriter counts what goes through it and fails past max.
type limitWriter struct {
	w   io.Writer
	n   int64
	max int64
}

func (l *limitWriter) Write(b []byte) (int, error) {
	if l.n+int64(len(b)) > l.max {
		return 0, errTooLarge
	}
	n, err := l.w.Write(b)
	l.n += int64(n)
	return n, err
}

// pack writes the directory rel of root as a tar.gz to a file of
// Config.TempDir and reports it with its size and digest, read as it was
// written. Entries are named relative to the directory; only directories
// and regular files the body owns go in (mode bits, modification time; no
// owner), each
// opened through a root of the directory, so nothing outside it is read
// whatever the body does to the tree meanwhile.
func (p *Publisher) pack(root *os.Root, rel, path string, owned func(fs.FileInfo) bool) (c content, err error) {
	dir, err := root.OpenRoot(rel)
	if err != nil {
		return content{}, refuse(http.StatusBadRequest, "%q cannot be published: %v", path, unquote(err))
	}
	defer dir.Close()
	if err := os.MkdirAll(p.cfg.TempDir, 0o700); err != nil {
		return content{}, fmt.Errorf("create %s: %w", p.cfg.TempDir, err)
	}
	f, err := os.CreateTemp(p.cfg.TempDir, "artifact-*.tar.gz")
	if err != nil {
		return content{}, fmt.Errorf("create a file to pack %q into: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	h := sha256.New()
	out := &limitWriter{w: io.MultiWriter(f, h), max: p.cfg.MaxBytes}
	zw := gzip.NewWriter(out)
	tw := tar.NewWriter(zw)
	var entries, skipped int
	walkErr := fs.WalkDir(dir.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		if entries++; entries > maxEntries {
			return fmt.Errorf("more than %d entries", maxEntries)
		}
		switch {
		case d.IsDir():
			info, err := d.Info()
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()})
		case d.Type().IsRegular():
			added, err := addFile(tw, dir, name, owned)
			if !added && err == nil {
				skipped++
			}
			return err
		default:
			skipped++ // a symbolic link, FIFO, socket or device
			return nil
		}
	})
	if walkErr == nil {
		walkErr = tw.Close()
	}
	if walkErr == nil {
		walkErr = zw.Close()
	}
	switch {
	case errors.Is(walkErr, errTooLarge):
		return content{}, refuse(http.StatusRequestEntityTooLarge, "%q packs to more than %d bytes, the most an artifact may be", path, p.cfg.MaxBytes)
	case walkErr != nil:
		return content{}, &lifecycle.PublishError{Status: http.StatusConflict, Message: fmt.Sprintf("pack %q", path), Err: walkErr}
	}
	if skipped > 0 {
		p.log.Info("packed a directory artifact without its links and special files", "skipped", skipped)
	}
	return content{f: f, size: out.n, sha256: hex.EncodeToString(h.Sum(nil)), contentType: wire.ContentTypeDir}, nil
}

// addFile adds the regular file name of dir to tw, reporting false when
// it is no regular file by the time it is opened, or not owned (it is then
// left out).
func addFile(tw *tar.Writer, dir *os.Root, name string, owned func(fs.FileInfo) bool) (bool, error) {
	f, err := dir.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil // removed meanwhile
	}
	if err != nil {
		return false, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return false, err
	}
	if !info.Mode().IsRegular() || !owned(info) {
		return false, nil
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: info.Size(), Mode: int64(info.Mode().Perm()), ModTime: info.ModTime()}); err != nil {
		return false, err
	}
	if n, err := io.CopyN(tw, f, info.Size()); err != nil {
		return false, fmt.Errorf("%s shrank to %d bytes while it was packed: %w", name, n, err)
	}
	return true, nil
}
