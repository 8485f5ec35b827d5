package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/atsinfer/ats/runtime/text/sampler"
)

// samplingFlags are the sampling options shared by run and chat, named as
// llama.cpp names them.
type samplingFlags struct {
	cfg       sampler.Config
	logitBias []string
	stop      []string
}

func (s *samplingFlags) register(f *pflag.FlagSet) {
	s.cfg = sampler.DefaultConfig()
	f.Float32Var(&s.cfg.Temperature, "temp", s.cfg.Temperature, "temperature (0: greedy)")
	f.IntVar(&s.cfg.TopK, "top-k", s.cfg.TopK, "top-k sampling (0: off)")
	f.Float32Var(&s.cfg.TopP, "top-p", s.cfg.TopP, "top-p (nucleus) sampling (1: off)")
	f.Float32Var(&s.cfg.MinP, "min-p", s.cfg.MinP, "min-p sampling (0: off)")
	f.Float32Var(&s.cfg.RepeatPenalty, "repeat-penalty", s.cfg.RepeatPenalty, "penalty for repeated tokens (1: off)")
	f.IntVar(&s.cfg.RepeatLastN, "repeat-last-n", s.cfg.RepeatLastN, "tokens the penalties look back over (0: off, -1: all)")
	f.Float32Var(&s.cfg.PresencePenalty, "presence-penalty", 0, "OpenAI presence penalty")
	f.Float32Var(&s.cfg.FrequencyPenalty, "frequency-penalty", 0, "OpenAI frequency penalty")
	f.Uint64Var(&s.cfg.Seed, "seed", 0, "random seed (0: random)")
	f.StringArrayVar(&s.logitBias, "logit-bias", nil, "TOKEN+BIAS or TOKEN-BIAS, e.g. 15043+1 or 15043-inf (repeatable)")
	f.StringArrayVar(&s.stop, "stop", nil, "stop string, not printed (repeatable)")
}

// config returns the sampler config with the logit biases parsed.
func (s *samplingFlags) config() (sampler.Config, error) {
	cfg := s.cfg
	if len(s.logitBias) > 0 {
		cfg.LogitBias = map[int]float32{}
	}
	for _, lb := range s.logitBias {
		i := strings.LastIndexAny(lb, "+-")
		if i <= 0 {
			return cfg, fmt.Errorf("--logit-bias %q: want TOKEN+BIAS or TOKEN-BIAS", lb)
		}
		tok, err := sampler.ParseTokenID(lb[:i])
		if err != nil {
			return cfg, fmt.Errorf("--logit-bias %q: %w", lb, err)
		}
		var bias float64
		if v := strings.ToLower(lb[i+1:]); v == "inf" {
			bias = math.Inf(1)
		} else if bias, err = strconv.ParseFloat(v, 32); err != nil {
			return cfg, fmt.Errorf("--logit-bias %q: %q is not a number", lb, lb[i+1:])
		}
		if lb[i] == '-' {
			bias = -bias
		}
		cfg.LogitBias[tok] = float32(bias)
	}
	return cfg, nil
}
