// Programmatic dependent launch (sm_90): a kernel launched with pdl=True may start while the
// kernel before it on the stream is still running. It must wait() before it touches global
// memory the previous kernel writes or reads; launch_dependents() lets the next kernel start.
#pragma once
namespace tmaflow { namespace griddep {
// Wait until every prerequisite grid has completed and its memory operations are visible to
// this grid. Returns at once in a grid launched without PDL.
// ptx: griddepcontrol.wait
// who: every thread that touches memory the previous kernel writes or reads (or one thread,
// then a CTA barrier)
// order: acquire of the previous grid's writes.
TMAFLOW_DEVICE void wait() {
  TMAFLOW_TRACE_BEGIN(kGriddepWait);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  TMAFLOW_TRACE_SPAN(kGriddepWait, -1, 0, 0, 0);
}
// The dependent grid may be scheduled once every CTA of this grid has issued this (or exited).
// A hint: the dependent's wait() still waits for this grid's completion, so issuing it early
// is always correct.
// ptx: griddepcontrol.launch_dependents
// who: one thread per CTA suffices
// order: none (a scheduling hint).
TMAFLOW_DEVICE void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
}}  // namespace tmaflow::griddep
