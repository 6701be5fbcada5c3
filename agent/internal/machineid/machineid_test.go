package machineid

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"testing"
	"time"
)

const (
	machineIDInstanceID = "i-0123456789abcdef0"
	machineIDToken      = "AQAEAFakeTokenForTests=="
)

// machineIDIMDS is an IMDSv2 on a real loopback socket: PUT /latest/api/token with
// a TTL header issues a token, and the instance id is served only to a GET
// that carries it.
type machineIDIMDS struct {
	*httptest.Server
	requests   atomic.Int32
	tokenless  atomic.Int32 // metadata GETs without the token: IMDSv1
	tokenCode  int          // non-zero: the token PUT answers this
	idCode     int          // non-zero: the instance-id GET answers this
	hang       chan struct{}
	instanceID string
}

func newMachineIDIMDS(t *testing.T, configure func(*machineIDIMDS)) *machineIDIMDS {
	t.Helper()
	f := &machineIDIMDS{instanceID: machineIDInstanceID}
	if configure != nil {
		configure(f)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		if f.hang != nil {
			select {
			case <-f.hang:
			case <-r.Context().Done():
			}
			return
		}
		if f.tokenCode != 0 {
			w.WriteHeader(f.tokenCode)
			return
		}
		ttl := r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds")
		if ttl == "" {
			http.Error(w, "missing TTL", http.StatusBadRequest)
			return
		}
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", ttl)
		_, _ = w.Write([]byte(machineIDToken))
	})
	mux.HandleFunc("GET /latest/meta-data/instance-id", func(w http.ResponseWriter, r *http.Request) {
		f.requests.Add(1)
		if r.Header.Get("X-aws-ec2-metadata-token") != machineIDToken {
			f.tokenless.Add(1)
			http.Error(w, "", http.StatusUnauthorized)
			return
		}
		if f.idCode != 0 {
			w.WriteHeader(f.idCode)
			return
		}
		_, _ = w.Write([]byte(f.instanceID))
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(func() {
		if f.hang != nil {
			close(f.hang)
		}
		f.Close()
	})
	return f
}

// machineIDEnv is a Getenv over a fixed map, so the real environment never
// leaks into a test.
func machineIDEnv(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func machineIDFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "machine-id")
	if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
		t.Fatal(err)
	}
	return p
}

func machineIDHostname(name string) func() (string, error) {
	return func() (string, error) { return name, nil }
}

func TestLookup(t *testing.T) {
	const rawMachineID = "4c4c4544003957108052b4c04f384833"
	hashedMachineID := appSpecific(rawMachineID)
	down := httptest.NewServer(http.NotFoundHandler())
	downURL := down.URL
	down.Close() // nothing listens there now: connections are refused

	tests := []struct {
		name       string
		flag       string
		imds       func(*machineIDIMDS) // nil: no fake
		useFake    string               // "opt", "env" or "" (endpoint below)
		endpoint   string
		env        []string
		file       string // content; "-" means no file
		hostname   func() (string, error)
		wantID     string
		wantSource string
		wantHits   int32 // requests the fake must have seen (-1: any)
		wantErr    bool
	}{
		{
			name: "flag wins over everything", flag: "  rack7-node3 ",
			imds: func(*machineIDIMDS) {}, useFake: "opt", file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: "rack7-node3", wantSource: SourceFlag, wantHits: 0,
		},
		{
			name: "imds v2 from the option",
			imds: func(*machineIDIMDS) {}, useFake: "opt", file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: machineIDInstanceID, wantSource: SourceIMDS, wantHits: 2,
		},
		{
			name: "imds v2 from AWS_EC2_METADATA_SERVICE_ENDPOINT",
			imds: func(*machineIDIMDS) {}, useFake: "env", file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: machineIDInstanceID, wantSource: SourceIMDS, wantHits: 2,
		},
		{
			name: "imds instance id is trimmed",
			imds: func(f *machineIDIMDS) { f.instanceID = machineIDInstanceID + "\n" }, useFake: "opt", file: "-", hostname: machineIDHostname("h"),
			wantID: machineIDInstanceID, wantSource: SourceIMDS, wantHits: 2,
		},
		{
			name: "AWS_EC2_METADATA_DISABLED=true skips imds",
			imds: func(*machineIDIMDS) {}, useFake: "env", env: []string{"AWS_EC2_METADATA_DISABLED", "TRUE"},
			file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: hashedMachineID, wantSource: SourceFile, wantHits: 0,
		},
		{
			// One rule for every IMDS user (internal/imds.Resolve): the
			// agent's own configuration is an explicit choice and wins.
			name: "a configured endpoint wins over AWS_EC2_METADATA_DISABLED",
			imds: func(*machineIDIMDS) {}, useFake: "opt", env: []string{"AWS_EC2_METADATA_DISABLED", "true"},
			file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: machineIDInstanceID, wantSource: SourceIMDS, wantHits: 2,
		},
		{
			name:     "imds down falls through to the machine-id file",
			endpoint: downURL, file: rawMachineID + "\n", hostname: machineIDHostname("h"),
			wantID: hashedMachineID, wantSource: SourceFile, wantHits: -1,
		},
		{
			name: "imds without v2 tokens is not asked in v1",
			imds: func(f *machineIDIMDS) { f.tokenCode = http.StatusForbidden }, useFake: "opt", file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: hashedMachineID, wantSource: SourceFile, wantHits: 1,
		},
		{
			name: "imds without an instance id falls through",
			imds: func(f *machineIDIMDS) { f.idCode = http.StatusNotFound }, useFake: "opt", file: rawMachineID, hostname: machineIDHostname("h"),
			wantID: hashedMachineID, wantSource: SourceFile, wantHits: 2,
		},
		{
			name:     "empty machine-id file falls through to the hostname",
			endpoint: downURL, file: " \n", hostname: machineIDHostname("build-box\n"),
			wantID: "build-box", wantSource: SourceHostname, wantHits: -1,
		},
		{
			name: "no machine-id file: the hostname",
			env:  []string{"AWS_EC2_METADATA_DISABLED", "true"}, file: "-", hostname: machineIDHostname("build-box"),
			wantID: "build-box", wantSource: SourceHostname, wantHits: -1,
		},
		{
			name: "nothing at all is an error",
			env:  []string{"AWS_EC2_METADATA_DISABLED", "true"}, file: "-",
			hostname: func() (string, error) { return "", errors.New("uname failed") },
			wantErr:  true, wantHits: -1,
		},
		{
			name: "an empty hostname is an error",
			env:  []string{"AWS_EC2_METADATA_DISABLED", "true"}, file: "-", hostname: machineIDHostname(""),
			wantErr: true, wantHits: -1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := Options{Hostname: tt.hostname, IMDSEndpoint: tt.endpoint}
			env := tt.env
			var f *machineIDIMDS
			if tt.imds != nil {
				f = newMachineIDIMDS(t, tt.imds)
				switch tt.useFake {
				case "opt":
					opts.IMDSEndpoint = f.URL
				case "env":
					env = append(env, "AWS_EC2_METADATA_SERVICE_ENDPOINT", f.URL)
				}
			}
			if opts.IMDSEndpoint == "" && tt.useFake != "env" {
				// Never ask the real 169.254.169.254 from a test.
				opts.IMDSEndpoint = downURL
			}
			opts.Getenv = machineIDEnv(env...)
			opts.File = filepath.Join(t.TempDir(), "absent")
			if tt.file != "-" {
				opts.File = machineIDFile(t, tt.file)
			}

			id, source, err := Lookup(context.Background(), tt.flag, opts)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("Lookup = %q (%s), want an error", id, source)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if id != tt.wantID || source != tt.wantSource {
				t.Errorf("Lookup = %q (%s), want %q (%s)", id, source, tt.wantID, tt.wantSource)
			}
			if f != nil {
				if tt.wantHits >= 0 && f.requests.Load() != tt.wantHits {
					t.Errorf("imds saw %d requests, want %d", f.requests.Load(), tt.wantHits)
				}
				if n := f.tokenless.Load(); n != 0 {
					t.Errorf("imds saw %d token-less (IMDSv1) requests", n)
				}
			}
		})
	}
}

// TestLookupIMDSHangs: an IMDS that never answers costs about a second,
// then the next source answers.
func TestLookupIMDSHangs(t *testing.T) {
	f := newMachineIDIMDS(t, func(f *machineIDIMDS) { f.hang = make(chan struct{}) })
	start := time.Now()
	id, source, err := Lookup(context.Background(), "", Options{
		IMDSEndpoint: f.URL,
		File:         machineIDFile(t, "abc"),
		Getenv:       machineIDEnv(),
	})
	elapsed := time.Since(start)
	if err != nil || source != SourceFile || id != appSpecific("abc") {
		t.Fatalf("Lookup = %q (%s), %v; want the machine-id file", id, source, err)
	}
	if elapsed > 3*time.Second {
		t.Errorf("a hung IMDS delayed start-up by %s, want about %s", elapsed, DefaultIMDSTimeout)
	}
	if f.requests.Load() == 0 {
		t.Error("the hung IMDS was never asked")
	}
}

func TestMachineIDFromFileIsStableAndOpaque(t *testing.T) {
	a, b := appSpecific("4c4c4544003957108052b4c04f384833"), appSpecific("4c4c4544003957108052b4c04f384833")
	other := appSpecific("00000000000000000000000000000001")
	if a != b || a == other {
		t.Errorf("ids %q %q %q: want stable per machine and distinct across machines", a, b, other)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(a) || a == "4c4c4544003957108052b4c04f384833" {
		t.Errorf("id %q: want 32 hex digits that are not the raw machine id", a)
	}
}
