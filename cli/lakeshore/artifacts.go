package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/ids"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The artifacts commands (docs/artifacts.md). They register --url and
// --token as every client command does, but not the shared -o/--output:
// `artifacts get` pins -o to the path it writes, so `artifacts ls` takes
// --output (-o) text|json itself.
func newArtifactsCmd() *cobra.Command {
	o := &clientOptions{output: outputText}
	cmd := &cobra.Command{
		Use:   "artifacts",
		Short: "List and fetch the files bodies published (per attempt; only the counted attempt's are the invocation's)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return errors.New("say what to do: lakeshore artifacts ls|get")
		},
	}
	o.registerTarget(cmd)
	cmd.AddCommand(newArtifactsLsCmd(o), newArtifactsGetCmd(o))
	return cmd
}

// listArtifacts lists the artifacts of id, an invocation or a run.
func listArtifacts(ctx context.Context, c *client.Client, id string) (wire.ArtifactList, bool, error) {
	switch {
	case ids.Valid(ids.Invocation, id):
		l, err := c.InvocationArtifacts(ctx, id)
		return l, false, err
	case ids.Valid(ids.Run, id):
		l, err := c.RunArtifacts(ctx, id)
		return l, true, err
	}
	return wire.ArtifactList{}, false, fmt.Errorf("%q is not an invocation (inv_…) or a run (run_…) id", id)
}

func newArtifactsLsCmd(o *clientOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ls INV|RUN",
		Short: "List the artifacts of an invocation or of every job of a run",
		Long: `List the artifacts of an invocation (every attempt's) or of a run (every
job's). COUNTED is "yes" for the attempt whose outcome is the invocation's;
an artifact of any other attempt says how that attempt ended (requeued,
superseded, stale, ...), or "running" while it runs.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			list, run, err := listArtifacts(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			if o.json() {
				return printJSON(cmd.OutOrStdout(), list)
			}
			return artifactTable(cmd.OutOrStdout(), list.Artifacts, run, time.Now())
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", outputText, "output format: text or json")
	return cmd
}

// artifactTable writes artifacts as a table (with each job's index for a
// run's).
func artifactTable(w io.Writer, list []wire.Artifact, run bool, now time.Time) error {
	tw := newTable(w)
	head := "NAME\tATTEMPT\tCOUNTED\tSIZE\tSHA256\tCREATED"
	if run {
		head = "INDEX\t" + head
	}
	fmt.Fprintln(tw, head)
	for _, a := range list {
		if run {
			index := "-"
			if a.Index != nil {
				index = strconv.Itoa(*a.Index)
			}
			fmt.Fprintf(tw, "%s\t", index)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t%s\n", cell(a.Name), a.Attempt, countedText(a), a.Size,
			a.SHA256[:min(12, len(a.SHA256))], age(now, a.CreatedAt)+" ago")
	}
	return tw.Flush()
}

// countedText says whether a is the invocation's, or how its attempt ended.
func countedText(a wire.Artifact) string {
	switch {
	case a.Counted:
		return "yes"
	case a.AttemptOutcome == "":
		return "no (running)"
	default:
		return "no (" + cell(a.AttemptOutcome) + ")"
	}
}

type artifactsGetOptions struct {
	out     string
	raw     bool
	all     bool
	attempt int
}

func newArtifactsGetCmd(o *clientOptions) *cobra.Command {
	var g artifactsGetOptions
	cmd := &cobra.Command{
		Use:   "get INV NAME [-o PATH] [--raw] | get RUN --all -o DIR",
		Short: "Download an artifact (sha256 checked); a directory artifact is unpacked",
		Long: `Download artifact NAME of an invocation to PATH (default: NAME in the
current directory), checking its size and sha256. It is the counted
attempt's artifact; --attempt N takes attempt N's instead. A directory
artifact (content type ` + wire.ContentTypeDir + `) is unpacked into PATH,
which must not exist or be empty; --raw keeps the tar.gz as is. Entries that
would land outside PATH (absolute, "..", links out of it) are refused.

With a run and --all, every job's counted artifacts are laid out under DIR
as DIR/<index>/<name>.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.client()
			if err != nil {
				return err
			}
			if g.all {
				if len(args) != 1 || !ids.Valid(ids.Run, args[0]) || g.out == "" {
					return errors.New("--all takes one run id and -o DIR: lakeshore artifacts get RUN --all -o DIR")
				}
				return getRunArtifacts(cmd.Context(), c, args[0], g, cmd.ErrOrStderr())
			}
			if len(args) != 2 || !ids.Valid(ids.Invocation, args[0]) {
				return errors.New("say which: lakeshore artifacts get INV NAME [-o PATH] (a run takes --all -o DIR)")
			}
			return getArtifact(cmd.Context(), c, args[0], args[1], g, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVarP(&g.out, "out", "o", "", "where to write: a file, or the directory a directory artifact unpacks into")
	f.BoolVar(&g.raw, "raw", false, "keep a directory artifact's tar.gz as is")
	f.BoolVar(&g.all, "all", false, "with a run: every job's counted artifacts, as DIR/<index>/<name>")
	f.IntVar(&g.attempt, "attempt", 0, "take this attempt's artifact, not the counted one")
	return cmd
}

// getArtifact downloads artifact name of invocation id (getArtifactsOptions).
func getArtifact(ctx context.Context, c *client.Client, id, name string, g artifactsGetOptions, stderr io.Writer) error {
	list, err := c.InvocationArtifacts(ctx, id)
	if err != nil {
		return err
	}
	var found *wire.Artifact
	var others []string
	for i, a := range list.Artifacts {
		if a.Name != name {
			continue
		}
		if (g.attempt == 0 && a.Counted) || (g.attempt != 0 && a.Attempt == g.attempt) {
			found = &list.Artifacts[i]
			break
		}
		others = append(others, strconv.Itoa(a.Attempt)+" ("+countedText(a)+")")
	}
	switch {
	case found != nil:
	case len(others) > 0 && g.attempt == 0:
		return fmt.Errorf("invocation %s has no counted artifact %q; attempts %s published one (take one with --attempt N)",
			id, name, strings.Join(others, ", "))
	case g.attempt != 0:
		return fmt.Errorf("attempt %d of invocation %s published no artifact %q", g.attempt, id, name)
	default:
		return fmt.Errorf("invocation %s has no artifact %q (lakeshore artifacts ls %s)", id, name, id)
	}
	dest := g.out
	if dest == "" {
		dest = name
		if isDir(*found) && g.raw {
			dest += ".tar.gz"
		}
	}
	if err := fetchArtifact(ctx, c, *found, dest, g.raw); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%s: %d bytes, sha256 %s\n", dest, found.Size, found.SHA256)
	return nil
}

// getRunArtifacts lays out every counted artifact of run id under g.out as
// <index>/<name>.
func getRunArtifacts(ctx context.Context, c *client.Client, id string, g artifactsGetOptions, stderr io.Writer) error {
	list, err := c.RunArtifacts(ctx, id)
	if err != nil {
		return err
	}
	n := 0
	for _, a := range list.Artifacts {
		if !a.Counted || a.Index == nil {
			continue
		}
		if err := wire.CheckArtifactName(a.Name); err != nil {
			return fmt.Errorf("job %d: %w", *a.Index, err)
		}
		dir := filepath.Join(g.out, strconv.Itoa(*a.Index))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("artifacts of job %d: %w", *a.Index, err)
		}
		if err := fetchArtifact(ctx, c, a, filepath.Join(dir, a.Name), g.raw); err != nil {
			return fmt.Errorf("job %d: %w", *a.Index, err)
		}
		n++
	}
	fmt.Fprintf(stderr, "%d artifacts of run %s under %s\n", n, id, g.out)
	return nil
}

func isDir(a wire.Artifact) bool { return a.ContentType == wire.ContentTypeDir }

// fetchArtifact downloads a into a temporary file beside dest (its size
// and sha256 checked), then renames it to dest, or, for a directory
// artifact unless raw, unpacks it into dest: nothing unverified lands.
func fetchArtifact(ctx context.Context, c *client.Client, a wire.Artifact, dest string, raw bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".lakeshore-artifact-*")
	if err != nil {
		return fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	defer os.Remove(tmp.Name())
	err = c.DownloadArtifact(ctx, a, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if !isDir(a) || raw {
		if err := os.Rename(tmp.Name(), dest); err != nil {
			return fmt.Errorf("artifact %q: %w", a.Name, err)
		}
		return nil
	}
	f, err := os.Open(tmp.Name())
	if err != nil {
		return fmt.Errorf("artifact %q: %w", a.Name, err)
	}
	defer f.Close()
	if err := unpackDir(f, dest); err != nil {
		return fmt.Errorf("unpack directory artifact %q into %s: %w", a.Name, dest, err)
	}
	return nil
}

// unpackDir unpacks a gzipped tar into dir, which must not exist or be
// empty. Only directories, regular files and symlinks that point inside
// (relative, no "..") are taken; an absolute name, one with "..", a hard
// link, a device or a link out of dir is refused, and every write goes
// through an os.Root at dir, which follows no link out of it either.
func unpackDir(r io.Reader, dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	if entries, err := os.ReadDir(dir); err != nil {
		return err
	} else if len(entries) > 0 {
		return fmt.Errorf("%s is not empty", dir)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	zr, err := gzip.NewReader(r)
	if err != nil {
		return err
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name, err := entryName(h.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
		case tar.TypeReg:
			err = writeEntry(root, name, h.FileInfo().Mode().Perm(), tr)
		case tar.TypeSymlink:
			if path.IsAbs(h.Linkname) || hasDotDot(h.Linkname) {
				return fmt.Errorf("entry %q links to %q: a link must stay inside (relative, no \"..\")", h.Name, h.Linkname)
			}
			if err = root.MkdirAll(path.Dir(name), 0o755); err == nil {
				err = root.Symlink(h.Linkname, name)
			}
		default:
			return fmt.Errorf("entry %q is of a kind not unpacked (%q): only directories, files and links inside", h.Name, h.Typeflag)
		}
		if err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

// entryName reports a tar entry's name as a clean relative path, refusing
// one that is absolute or steps up.
func entryName(name string) (string, error) {
	if name == "" || path.IsAbs(name) || strings.Contains(name, `\`) || hasDotDot(name) {
		return "", fmt.Errorf("entry %q would land outside the directory (absolute, \"..\" or \\)", name)
	}
	return path.Clean(name), nil
}

// hasDotDot reports whether a slash path has a ".." element.
func hasDotDot(p string) bool {
	for _, e := range strings.Split(p, "/") {
		if e == ".." {
			return true
		}
	}
	return false
}

// writeEntry writes a regular file's content at name under root; a name
// already there is refused (an archive names each file once).
func writeEntry(root *os.Root, name string, perm fs.FileMode, r io.Reader) error {
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm|0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
