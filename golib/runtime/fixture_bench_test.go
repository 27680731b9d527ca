package runtime

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkFixtureDecode runs a growing decode loop (past 32 -> 64 tokens,
// presents fed back as pasts) on exported models given as decompressed
// .onnx files, for profiling the executor on real exports:
//
//	python -c "import sys; sys.path.insert(0, 'tests'); import _fixtures as fx; \
//	    open('llama-dynamo.onnx', 'wb').write(fx.model_bytes('llama-dynamo'))"
//	OLKV_FIXTURE_MODELS=llama-dynamo.onnx go test -run - -bench FixtureDecode -benchmem ./golib/runtime
//
// OLKV_FIXTURE_MODELS is a comma-separated list of paths; the benchmark is
// skipped when it is not set. cpu-ns/op is the process's CPU time per step
// (all its threads, the garbage collector's included): on a machine shared
// with other work it varies less than the wall time. Only exports whose pasts grow (torch.onnx,
// optimum) are driven; shared-buffer exports are skipped.
func BenchmarkFixtureDecode(b *testing.B) {
	fixtureBenchCases(b, func(b *testing.B, path string, threads int) {
		d := openGrowingDriver(b, path, Options{Threads: threads})
		s := d.s
		b.ReportAllocs()
		cpu0, cpuOK := processCPUTime()
		for b.Loop() {
			d.run(b, 1)
		}
		if cpu1, ok := processCPUTime(); ok && cpuOK {
			b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/op")
		}
		b.ReportMetric(float64(len(s.Plan().Nodes)), "nodes")
	})
}

// fixtureBenchCases runs fn as a sub-benchmark for every model path in
// OLKV_FIXTURE_MODELS (comma-separated) on 1 and 2 threads; the benchmark is
// skipped when the variable is not set.
func fixtureBenchCases(b *testing.B, fn func(b *testing.B, path string, threads int)) {
	paths := os.Getenv("OLKV_FIXTURE_MODELS")
	if paths == "" {
		b.Skip("OLKV_FIXTURE_MODELS is not set")
	}
	for _, path := range strings.Split(paths, ",") {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", strings.TrimSuffix(filepath.Base(path), ".onnx"), threads), func(b *testing.B) {
				fn(b, path, threads)
			})
		}
	}
}

// BenchmarkFixtureExecutor measures the executor's own cost on the same
// decode loop as BenchmarkFixtureDecode (same OLKV_FIXTURE_MODELS): a plain
// session and a profiled one run the loop step for step; per step, the plain
// run's Duration minus the profiled run's kernel times is the time outside
// kernels, so the profiler's clock reads are not counted. Reported as
// medians over the steps (robust to the other work of a shared machine):
// exec-share (of the plain run), exec-ns/node (per node of the plan: kernels
// run, kept geometry reused or passed by, Casts passed through) and run-ns
// (the plain run's Duration).
func BenchmarkFixtureExecutor(b *testing.B) {
	fixtureBenchCases(b, func(b *testing.B, path string, threads int) {
		var drivers [2]*growingDriver
		for k, profile := range []bool{false, true} {
			drivers[k] = openGrowingDriver(b, path, Options{Threads: threads, Profile: profile})
		}
		var share, outside, runs []float64
		events := 0
		for b.Loop() {
			drivers[0].run(b, 1)
			drivers[1].run(b, 1)
			run := drivers[0].stats.Duration
			var kernels time.Duration
			for _, e := range drivers[1].stats.Events {
				kernels += e.Duration
			}
			events += len(drivers[1].stats.Events)
			share = append(share, float64(run-kernels)/float64(run))
			outside = append(outside, float64(run-kernels))
			runs = append(runs, float64(run))
		}
		visited := float64(len(drivers[0].s.Plan().Nodes))
		b.ReportMetric(median(share), "exec-share")
		b.ReportMetric(median(outside)/visited, "exec-ns/node")
		b.ReportMetric(median(runs), "run-ns")
		b.ReportMetric(float64(events)/float64(b.N), "kernels/step")
	})
}

// median returns the median of v (reordering it).
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// openGrowingDriver opens path with opts (closed when b ends), skips b when
// the export's pasts do not grow, and runs 40 warm-up steps (the pool and the
// shape cache).
func openGrowingDriver(b *testing.B, path string, opts Options) *growingDriver {
	s, err := NewSession(path, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	d, ok := newGrowingDriver(b, s)
	if !ok {
		b.Skip("not a growing-past export")
	}
	d.run(b, 40)
	return d
}

// growingDriver feeds an exported decoder one token per step.
type growingDriver struct {
	s        *Session
	start    int
	past     int
	feeds    map[string]*tensor.Tensor
	pairs    map[string]string // present output -> past input
	outNames []string
	held     []*tensor.Tensor
	stats    *RunStats // the last step's
}

func newGrowingDriver(tb testing.TB, s *Session) (*growingDriver, bool) {
	d := &growingDriver{s: s, start: 32, feeds: map[string]*tensor.Tensor{}, pairs: map[string]string{}}
	for _, o := range s.Outputs() {
		d.outNames = append(d.outNames, o.Name)
	}
	for _, in := range s.Inputs() {
		switch {
		case strings.Contains(in.Name, "past") && len(in.Shape) == 4:
			present := strings.Replace(strings.Replace(in.Name, "past_key_values", "present", 1), "past", "present", 1)
			found := false
			for _, o := range d.outNames {
				if o == present {
					found = true
				}
			}
			if !found {
				return nil, false
			}
			d.pairs[present] = in.Name
		case in.Name == "input_ids" || in.Name == "attention_mask" || in.Name == "position_ids":
		default:
			return nil, false
		}
	}
	d.reset(tb)
	return d, true
}

// reset restarts the loop at a random past of d.start tokens.
func (d *growingDriver) reset(tb testing.TB) {
	d.s.DefaultState().Release(d.held...)
	d.held = nil
	d.past = d.start
	for _, in := range d.s.Inputs() {
		if len(in.Shape) == 4 {
			t, err := tensor.New(in.DType, tensor.Shape{1, int(in.Shape[1].Value), d.past, int(in.Shape[3].Value)})
			if err != nil {
				tb.Fatal(err)
			}
			d.feeds[in.Name] = t
		}
	}
}

// run makes n decode steps, restarting after 32.
func (d *growingDriver) run(tb testing.TB, n int) {
	for range n {
		if d.past >= 2*d.start {
			d.reset(tb)
		}
		for _, in := range d.s.Inputs() {
			switch in.Name {
			case "input_ids":
				d.feeds[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(d.past % 200)})
			case "position_ids":
				d.feeds[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(d.past)})
			case "attention_mask":
				m := make([]int64, d.past+1)
				for i := range m {
					m[i] = 1
				}
				d.feeds[in.Name], _ = tensor.FromSlice(tensor.Shape{1, d.past + 1}, m)
			}
		}
		outs, stats, err := d.s.Run(d.feeds, d.outNames)
		if err != nil {
			tb.Fatal(err)
		}
		d.stats = stats
		d.s.DefaultState().Release(d.held...)
		d.held = outs
		for i, o := range d.outNames {
			if p, ok := d.pairs[o]; ok {
				d.feeds[p] = outs[i]
			}
		}
		d.past++
	}
}
