package server

import (
	"strconv"
	"time"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/session"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Placement says where the model's weights live, for /metrics. The engine
// reports what it decided; today everything is on the CPU.
type Placement struct {
	// Backend names what computes: "cpu", or "cuda" / "cpu+cuda" once
	// the GPU backend places weights.
	Backend string
	// WeightBytes is the size of the weights on each device ("cpu",
	// "gpu"); devices missing from the map hold none.
	WeightBytes map[string]int64
	// PromotedBytes is the size of CPU weights copied to the GPU for the
	// last decode step (dynamic promotion), when the engine does that.
	PromotedBytes int64
	// StreamedBytes is the weight bytes streamed to the GPU so far
	// (prefill batches run CPU-resident units there).
	StreamedBytes int64
	// VRAMBudget is the placement's budget, VRAMUsed what the context
	// allocated on the GPU (both 0 on the CPU).
	VRAMBudget, VRAMUsed int64
	// Replans counts dynamic promotion's plans; LinkBytesPerS is its
	// estimate of the link's speed for weight copies (0: not measured).
	Replans       int64
	LinkBytesPerS float64
}

// GPUStat is one GPU's figures (NVML) for /metrics.
type GPUStat struct {
	Index            int
	Name             string
	MemoryUsedBytes  int64
	MemoryTotalBytes int64
	Utilization      float64 // busy fraction, 0..1
	PCIeRxBytesPerS  float64 // host to device
	PCIeTxBytesPerS  float64 // device to host
}

// CPUPlacement is the placement of a model run wholly on the CPU.
func CPUPlacement(m *model.Model) func() Placement {
	bytes := m.WeightBytes()
	return func() Placement {
		return Placement{Backend: "cpu", WeightBytes: map[string]int64{"cpu": bytes, "gpu": 0}}
	}
}

// SessionPlacement reports where the session's context computes and
// where its weights (and KV caches) live under its placement.
func SessionPlacement(s *session.Session) func() Placement {
	pl := s.Placement
	backend := map[string]string{executor.BackendCPU: "cpu", executor.BackendGPU: "cuda", executor.BackendHybrid: "cpu+cuda"}[s.Backend()]
	cpuBytes, gpuBytes := pl.WeightBytes()
	vram := s.VRAM()
	ctx, prom := s.Ctx, s.Promoter
	return func() Placement {
		promoted, replans, link := prom.Live()
		return Placement{Backend: backend, WeightBytes: map[string]int64{"cpu": cpuBytes, "gpu": gpuBytes},
			StreamedBytes: ctx.Streamed(), VRAMBudget: vram.Budget, VRAMUsed: vram.Allocated,
			PromotedBytes: promoted, Replans: replans, LinkBytesPerS: link}
	}
}

// metrics are the server's Prometheus series, on a registry of its own so
// several servers (tests) never collide.
type metrics struct {
	reg *prometheus.Registry

	requests        *prometheus.CounterVec   // endpoint, code
	requestDuration *prometheus.HistogramVec // endpoint
	queueWait       prometheus.Histogram
	ttft            prometheus.Histogram
	tpot            prometheus.Histogram
	promptTokens    prometheus.Counter
	cachedTokens    prometheus.Counter
	genTokens       prometheus.Counter
	prefillSeconds  prometheus.Counter
	decodeSeconds   prometheus.Counter
	prefillRate     prometheus.Gauge
	decodeRate      prometheus.Gauge
	queueLength     prometheus.Gauge
	running         prometheus.Gauge
	cancelled       prometheus.Counter
	contextTokens   prometheus.Gauge
	stepRows        prometheus.Histogram
	stepRequests    prometheus.Histogram
	stepSeconds     prometheus.Histogram
	cachePositions  *prometheus.GaugeVec // state
}

func newMetrics(cfg *Config, sess *session.Session) *metrics {
	ctxSize := sess.CtxSize()
	reg := prometheus.NewRegistry()
	m := &metrics{reg: reg}
	// Token latencies span a tiny CPU model (sub-millisecond) to a large
	// model spilling to the CPU (seconds).
	latency := prometheus.ExponentialBuckets(0.0005, 2, 18) // 0.5 ms .. 65 s
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ats_requests_total", Help: "HTTP requests by endpoint and status code.",
	}, []string{"endpoint", "code"})
	m.requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "ats_request_duration_seconds", Help: "Time from receiving a request to its last byte.", Buckets: latency,
	}, []string{"endpoint"})
	m.queueWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_queue_wait_seconds", Help: "Time a generation request waited for the model.", Buckets: latency})
	m.ttft = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_time_to_first_token_seconds", Help: "Time from receiving a request to its first generated token, queueing included.", Buckets: latency})
	m.tpot = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_time_per_output_token_seconds", Help: "Decode time per generated token after the first.", Buckets: latency})
	m.promptTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_prompt_tokens_total", Help: "Prompt tokens of generation requests."})
	m.cachedTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_prompt_tokens_cached_total", Help: "Prompt tokens whose KV cache was reused from an earlier request."})
	m.genTokens = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_generated_tokens_total", Help: "Tokens generated."})
	m.prefillSeconds = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_prefill_seconds_total", Help: "Time spent evaluating prompts."})
	m.decodeSeconds = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_decode_seconds_total", Help: "Time spent generating tokens."})
	m.prefillRate = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_prefill_tokens_per_second", Help: "Prompt evaluation speed of the last request."})
	m.decodeRate = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_decode_tokens_per_second", Help: "Generation speed of the last request."})
	m.queueLength = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_queue_length", Help: "Requests waiting for the model."})
	m.running = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_requests_running", Help: "Requests being generated (at most ats_slots)."})
	// A step's rows: one a decoding request, up to the batch for prompts.
	rowsBuckets := []float64{1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048}
	m.stepRows = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_step_tokens", Help: "Tokens a step computed: one of each decoding request, plus prompt chunks.", Buckets: rowsBuckets})
	m.stepRequests = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_step_requests", Help: "Requests a step computed together (the batch size in sequences).", Buckets: []float64{1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64}})
	m.stepSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "ats_step_seconds", Help: "Wall time of a step.", Buckets: latency})
	m.cachePositions = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "ats_kv_cache_positions", Help: "KV cache positions (whole blocks) held by requests' sequences, kept for reuse by later requests, and free."}, []string{"state"})
	kv := sess.KVCache()
	kvInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ats_kv_cache_info", Help: "The KV cache's type (value 1)."}, []string{"type"})
	kvInfo.WithLabelValues(kv.Type.String()).Set(1)
	kvBytes := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "ats_kv_cache_bytes", Help: "Bytes of the KV cache on each device."}, []string{"device"})
	kvBytes.WithLabelValues("cpu").Set(float64(kv.HostBytes))
	kvBytes.WithLabelValues("gpu").Set(float64(kv.DeviceBytes))
	slots := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_slots", Help: "Requests that may run at once (--parallel)."})
	slots.Set(float64(cfg.Parallel))
	m.cancelled = prometheus.NewCounter(prometheus.CounterOpts{Name: "ats_generations_cancelled_total", Help: "Generations stopped because the client left or the server shut down."})
	m.contextTokens = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_context_tokens", Help: "KV cache positions held by the requests' sequences (whole blocks)."})
	queueLimit := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_queue_limit", Help: "Requests that may wait for the model before new ones get 503."})
	queueLimit.Set(float64(cfg.QueueLimit))
	ctxGauge := prometheus.NewGauge(prometheus.GaugeOpts{Name: "ats_context_size", Help: "Tokens the KV cache can hold."})
	ctxGauge.Set(float64(ctxSize))

	reg.MustRegister(m.requests, m.requestDuration, m.queueWait, m.ttft, m.tpot,
		m.promptTokens, m.cachedTokens, m.genTokens, m.prefillSeconds, m.decodeSeconds,
		m.prefillRate, m.decodeRate, m.queueLength, m.running, m.cancelled, m.contextTokens,
		queueLimit, ctxGauge, m.stepRows, m.stepRequests, m.stepSeconds, m.cachePositions, kvInfo, kvBytes, slots,
		&placementCollector{placement: cfg.Placement, gpus: cfg.GPUStats},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// observeStep records a step of the scheduler (on its goroutine).
func (m *metrics) observeStep(si session.StepInfo) {
	m.stepRows.Observe(float64(si.Rows))
	m.stepRequests.Observe(float64(si.Requests))
	m.stepSeconds.Observe(si.Wall.Seconds())
	m.cachePositions.WithLabelValues("held").Set(float64(si.CacheHeld))
	m.cachePositions.WithLabelValues("kept").Set(float64(si.CacheKept))
	m.cachePositions.WithLabelValues("free").Set(float64(si.CacheFree))
	m.contextTokens.Set(float64(si.CacheHeld))
}

// observeGeneration records one finished (or stopped) generation.
func (m *metrics) observeGeneration(res *session.GenerateResult, received time.Time, firstToken time.Time) {
	m.promptTokens.Add(float64(res.PromptTokens))
	m.cachedTokens.Add(float64(res.CachedTokens))
	m.genTokens.Add(float64(len(res.Tokens)))
	m.prefillSeconds.Add(res.Prefill.Seconds())
	m.decodeSeconds.Add(res.Decode.Seconds())
	if r := res.PrefillRate(); r > 0 {
		m.prefillRate.Set(r)
	}
	if r := res.DecodeRate(); r > 0 {
		m.decodeRate.Set(r)
		m.tpot.Observe(1 / r)
	}
	if !firstToken.IsZero() {
		m.ttft.Observe(firstToken.Sub(received).Seconds())
	}
}

// placementCollector reads the placement and the GPU figures at scrape
// time, so they are current without a polling goroutine. The GPU backend
// plugs in through Config.GPUStats.
type placementCollector struct {
	placement func() Placement
	gpus      func() []GPUStat
}

var (
	descBackend  = prometheus.NewDesc("ats_backend_info", "The compute backend in use (value 1).", []string{"backend"}, nil)
	descWeights  = prometheus.NewDesc("ats_weight_bytes", "Bytes of model weights placed on each device.", []string{"device"}, nil)
	descPromoted = prometheus.NewDesc("ats_promoted_weight_bytes", "Bytes of CPU weights promoted to the GPU in each decode step under the current plan.", nil, nil)
	descStreamed = prometheus.NewDesc("ats_streamed_weight_bytes_total", "Bytes of CPU-resident weights streamed to the GPU (prefill).", nil, nil)
	descBudget   = prometheus.NewDesc("ats_vram_budget_bytes", "The VRAM budget of the placement.", nil, nil)
	descVRAMUsed = prometheus.NewDesc("ats_vram_used_bytes", "GPU memory ats allocated (weights, KV caches, buffers, staging ring).", nil, nil)
	descReplans  = prometheus.NewDesc("ats_replans_total", "Plans dynamic promotion made (re-planned as the machine's load changed).", nil, nil)
	descLink     = prometheus.NewDesc("ats_link_bytes_per_second", "Dynamic promotion's estimate of the speed of weight copies to the GPU.", nil, nil)
	descGPUCount = prometheus.NewDesc("ats_gpus", "GPUs ats uses.", nil, nil)
	descGPUUsed  = prometheus.NewDesc("ats_gpu_memory_used_bytes", "GPU memory in use.", []string{"gpu", "name"}, nil)
	descGPUTotal = prometheus.NewDesc("ats_gpu_memory_total_bytes", "GPU memory in total.", []string{"gpu", "name"}, nil)
	descGPUUtil  = prometheus.NewDesc("ats_gpu_utilization_ratio", "Fraction of time the GPU was busy.", []string{"gpu", "name"}, nil)
	descPCIeRx   = prometheus.NewDesc("ats_gpu_pcie_rx_bytes_per_second", "PCIe throughput from host to GPU.", []string{"gpu", "name"}, nil)
	descPCIeTx   = prometheus.NewDesc("ats_gpu_pcie_tx_bytes_per_second", "PCIe throughput from GPU to host.", []string{"gpu", "name"}, nil)
)

func (c *placementCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBackend, descWeights, descPromoted, descStreamed, descBudget, descVRAMUsed, descReplans, descLink, descGPUCount, descGPUUsed, descGPUTotal, descGPUUtil, descPCIeRx, descPCIeTx} {
		ch <- d
	}
}

func (c *placementCollector) Collect(ch chan<- prometheus.Metric) {
	if c.placement != nil {
		p := c.placement()
		ch <- prometheus.MustNewConstMetric(descBackend, prometheus.GaugeValue, 1, p.Backend)
		for dev, n := range p.WeightBytes {
			ch <- prometheus.MustNewConstMetric(descWeights, prometheus.GaugeValue, float64(n), dev)
		}
		ch <- prometheus.MustNewConstMetric(descPromoted, prometheus.GaugeValue, float64(p.PromotedBytes))
		ch <- prometheus.MustNewConstMetric(descStreamed, prometheus.CounterValue, float64(p.StreamedBytes))
		if p.VRAMBudget > 0 {
			ch <- prometheus.MustNewConstMetric(descBudget, prometheus.GaugeValue, float64(p.VRAMBudget))
			ch <- prometheus.MustNewConstMetric(descVRAMUsed, prometheus.GaugeValue, float64(p.VRAMUsed))
			ch <- prometheus.MustNewConstMetric(descReplans, prometheus.CounterValue, float64(p.Replans))
			if p.LinkBytesPerS > 0 {
				ch <- prometheus.MustNewConstMetric(descLink, prometheus.GaugeValue, p.LinkBytesPerS)
			}
		}
	}
	var gpus []GPUStat
	if c.gpus != nil {
		gpus = c.gpus()
	}
	ch <- prometheus.MustNewConstMetric(descGPUCount, prometheus.GaugeValue, float64(len(gpus)))
	for _, g := range gpus {
		l := []string{strconv.Itoa(g.Index), g.Name}
		ch <- prometheus.MustNewConstMetric(descGPUUsed, prometheus.GaugeValue, float64(g.MemoryUsedBytes), l...)
		ch <- prometheus.MustNewConstMetric(descGPUTotal, prometheus.GaugeValue, float64(g.MemoryTotalBytes), l...)
		ch <- prometheus.MustNewConstMetric(descGPUUtil, prometheus.GaugeValue, g.Utilization, l...)
		ch <- prometheus.MustNewConstMetric(descPCIeRx, prometheus.GaugeValue, g.PCIeRxBytesPerS, l...)
		ch <- prometheus.MustNewConstMetric(descPCIeTx, prometheus.GaugeValue, g.PCIeTxBytesPerS, l...)
	}
}
