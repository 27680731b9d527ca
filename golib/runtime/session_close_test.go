package runtime

import (
	"bufio"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// closeModel is a graph with a weight a kernel packs (MatMul, released
// once packed) and one read as stored (a uint8 Gather table: one-byte
// elements, so it aliases a mapped model file at any offset).
func closeModel(r *rand.Rand) *onnxpb.GraphProto {
	const d, rows = 128, 512
	w := make([]float32, d*d)
	for i := range w {
		w[i] = r.Float32() - 0.5
	}
	table := make([]byte, rows*d)
	for i := range table {
		table[i] = byte(r.Uint32()) | 1 // never zero: a released table reads zeros
	}
	type vi = *onnxpb.ValueInfoProto
	return onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("MatMul", []string{"x", "w"}, []string{"y"}),
		onnxtest.Node("Gather", []string{"table", "ids"}, []string{"rows"}),
	}, []vi{onnxtest.Info("x", 1, -1, d), onnxtest.Info("ids", 7, -1)},
		[]vi{onnxtest.Info("y", 1, -1, d), onnxtest.Info("rows", 2, -1, d)},
		onnxtest.Floats("w", []int64{d, d}, w), onnxtest.Raw("table", 2, []int64{rows, d}, table))
}

// closeFeeds are closeModel's feeds: three rows of x, three table rows.
func closeFeeds(t *testing.T) map[string]*tensor.Tensor {
	t.Helper()
	x, err := tensor.New(tensor.Float32, tensor.Shape{3, 128})
	if err != nil {
		t.Fatal(err)
	}
	for i := range x.Float32() {
		x.Float32()[i] = float32(i%7) - 3
	}
	ids, err := tensor.New(tensor.Int64, tensor.Shape{3})
	if err != nil {
		t.Fatal(err)
	}
	copy(ids.Int64(), []int64{0, 511, 77})
	return map[string]*tensor.Tensor{"x": x, "ids": ids}
}

// writeCloseModel writes closeModel, with the extra nodes appended, to
// dir/m.onnx (its initializers in dir/w.bin when external) and returns the
// model's path and the file whose bytes the session maps.
func writeCloseModel(t *testing.T, dir string, external bool, extra ...*onnxpb.NodeProto) (string, string) {
	t.Helper()
	g := closeModel(rand.New(rand.NewPCG(3, 4)))
	g.Node = append(g.Node, extra...)
	mapped := filepath.Join(dir, "m.onnx")
	if external {
		externalize(t, g, dir)
		mapped = filepath.Join(dir, "w.bin")
	}
	path := filepath.Join(dir, "m.onnx")
	if err := os.WriteFile(path, onnxtest.Bytes(onnxtest.Model(17, g, nil)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, mapped
}

// mappings counts the mappings of the file at path in /proc/self/maps
// (deleted or not).
func mappings(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		t.Skip("no /proc/self/maps")
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), " (deleted)")
		if strings.HasSuffix(line, " "+path) {
			n++
		}
	}
	return n
}

// sameOutputs reports whether got and want hold equal tensors
// (equalTensor: type, shape and bytes), one for one.
func sameOutputs(got, want []*tensor.Tensor) bool {
	return slices.EqualFunc(got, want, equalTensor)
}

// TestCloseUnmapsModelFiles: a session that loaded its model gives back the
// model's file mappings when closed (they lasted as long as the process
// before, and so did a deleted model file's disk space): the file leaves
// /proc/self/maps, the weight that aliased it reads as zeros, and runs
// fail with ErrClosed. A session over a model it does not own leaves the
// mappings to Model.Unmap.
func TestCloseUnmapsModelFiles(t *testing.T) {
	if !tensor.MapFileSupported {
		t.Skip("files are read, not mapped, on this platform")
	}
	for _, external := range []bool{false, true} {
		name := map[bool]string{false: "one-file", true: "external-data"}[external]
		t.Run(name, func(t *testing.T) {
			path, file := writeCloseModel(t, t.TempDir(), external)
			opt := Options{Threads: 1, Model: model.Options{MapMinBytes: 1}}
			s, err := NewSession(path, opt)
			if err != nil {
				t.Fatal(err)
			}
			if n := mappings(t, file); n != 1 {
				t.Fatalf("%d mappings of the model's file after loading, want 1", n)
			}
			table := s.Model().Graph.Initializers["table"]
			if !table.FileBacked() {
				t.Fatal("the Gather table does not alias the mapped file")
			}
			feeds := closeFeeds(t)
			want, _, err := s.Run(feeds, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(file); err != nil { // the mapping keeps the deleted file
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if n := mappings(t, file); n != 0 {
				t.Errorf("%d mappings of the deleted file after Close, want 0", n)
			}
			for i, v := range table.Bytes() {
				if v != 0 {
					t.Fatalf("the unmapped table reads %d at %d, want the released tensor's zeros", v, i)
				}
			}
			if _, _, err := s.Run(feeds, nil); !errors.Is(err, errs.ErrClosed) {
				t.Errorf("Run after Close: %v, want ErrClosed", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}

			// A model the caller loaded stays mapped until its Unmap.
			path, file = writeCloseModel(t, t.TempDir(), external)
			m, err := model.Load(path, opt.Model)
			if err != nil {
				t.Fatal(err)
			}
			s, err = NewSessionFromModel(m, opt)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := s.Run(feeds, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !sameOutputs(got, want) {
				t.Fatal("a session over a loaded model computes other outputs")
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if n := mappings(t, file); n != 1 {
				t.Fatalf("%d mappings after closing a session that does not own the model, want 1", n)
			}
			if n := m.Unmap(); n <= 0 {
				t.Errorf("Model.Unmap gave back %d bytes", n)
			}
			if n := mappings(t, file); n != 0 {
				t.Errorf("%d mappings after Model.Unmap, want 0", n)
			}
			if n := m.Unmap(); n != 0 {
				t.Errorf("a second Model.Unmap gave back %d bytes", n)
			}
		})
	}
}

// TestCloseWaitsForRuns: Close while runs are under way on other states
// waits for them before it unmaps the weights they read: every run either
// returns the outputs of a run before Close (not the released weights'
// zeros, nor a fault) or fails with ErrClosed.
func TestCloseWaitsForRuns(t *testing.T) {
	path, _ := writeCloseModel(t, t.TempDir(), false)
	s, err := NewSession(path, Options{Threads: 1, Model: model.Options{MapMinBytes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	feeds := closeFeeds(t)
	want, _, err := s.Run(feeds, nil)
	if err != nil {
		t.Fatal(err)
	}
	const workers = 4
	var wg sync.WaitGroup
	var started sync.WaitGroup
	started.Add(workers)
	fails := make(chan string, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := NewState()
			for i := 0; ; i++ {
				got, _, err := s.RunState(st, feeds, nil)
				if i == 0 {
					started.Done()
				}
				if errors.Is(err, errs.ErrClosed) {
					if i == 0 {
						fails <- "the first run failed: Close came before any run"
					}
					return
				}
				if err != nil {
					fails <- err.Error()
					return
				}
				if !sameOutputs(got, want) {
					fails <- "a run overlapping Close computed other outputs"
					return
				}
			}
		}()
	}
	started.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(fails)
	for f := range fails {
		t.Error(f)
	}
}

// TestFailedSessionUnmapsModelFiles: a session whose creation fails after
// its model was loaded (an op the runtime lacks) leaves no mapping of the
// model's files behind.
func TestFailedSessionUnmapsModelFiles(t *testing.T) {
	if !tensor.MapFileSupported {
		t.Skip("files are read, not mapped, on this platform")
	}
	for _, external := range []bool{false, true} {
		path, file := writeCloseModel(t, t.TempDir(), external, onnxtest.Node("NoSuchOp", []string{"y"}, []string{"z"}))
		_, err := NewSession(path, Options{Threads: 1, Model: model.Options{MapMinBytes: 1}})
		if !errors.Is(err, errs.ErrUnsupportedOp) {
			t.Fatalf("external %v: NewSession: %v, want ErrUnsupportedOp", external, err)
		}
		if n := mappings(t, file); n != 0 {
			t.Errorf("external %v: %d mappings of the model's file after a failed NewSession, want 0", external, n)
		}
	}
}
