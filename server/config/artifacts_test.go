package config

import (
	"strings"
	"testing"
)

// TestLoadArtifacts: a bucket, or a directory with its URL and secret, or
// neither; the limits when given; every malformed setting refused with the
// variable it names.
func TestLoadArtifacts(t *testing.T) {
	env := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	secret := strings.Repeat("ab", 16)
	got, err := LoadArtifacts(env(map[string]string{EnvArtifactsBucket: "b", EnvMaxArtifactBytes: "1024", EnvMaxArtifactsPerAttempt: "7"}))
	if err != nil || got.Bucket != "b" || got.Dir != "" || got.MaxBytes != 1024 || got.MaxPerAttempt != 7 {
		t.Fatalf("a bucket with limits: %+v %v", got, err)
	}
	got, err = LoadArtifacts(env(map[string]string{EnvArtifactsDir: "/d", EnvArtifactsURL: "http://127.0.0.1:1", EnvArtifactsSecret: secret}))
	if err != nil || got.Dir != "/d" || len(got.Secret) != 16 || got.MaxBytes != 0 || got.MaxPerAttempt != 0 {
		t.Fatalf("a directory: %+v %v", got, err)
	}
	if got, err := LoadArtifacts(env(nil)); err != nil || got.Bucket != "" || got.Dir != "" {
		t.Fatalf("neither: %+v %v", got, err)
	}
	for name, kv := range map[string]map[string]string{
		EnvArtifactsBucket:        {EnvArtifactsBucket: "b", EnvArtifactsDir: "/d", EnvArtifactsURL: "u", EnvArtifactsSecret: secret},
		EnvArtifactsSecret:        {EnvArtifactsDir: "/d", EnvArtifactsURL: "u", EnvArtifactsSecret: "abcd"},
		EnvArtifactsURL:           {EnvArtifactsDir: "/d", EnvArtifactsSecret: secret},
		EnvMaxArtifactBytes:       {EnvMaxArtifactBytes: "0"},
		EnvMaxArtifactsPerAttempt: {EnvMaxArtifactsPerAttempt: "1001"},
	} {
		if _, err := LoadArtifacts(env(kv)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: err = %v, want a refusal naming %s", kv, err, name)
		}
	}
}
