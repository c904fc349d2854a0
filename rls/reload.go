package rls

// Reloaded counts a reload of the descriptors (descriptors.Reloader, whose
// Target a Service is); err is nil when the new descriptors are in use.
func (s *Service) Reloaded(err error) {
	result := "ok"
	if err != nil {
		result = "failed"
	}
	s.m.reloads.WithLabelValues(result).Inc()
}
