/*
 * timeline_json.c - the tests' reader of timelines (t/util/hvdtest.c,
 * hvdt_timeline_*): it reads the JSON, not its bytes. The same events
 * written with their keys in another order, with keys it does not know,
 * with spaces, escapes and nested values, and without the closing "]" of
 * a file still open, give the same fields; a tensor's track, its last
 * span and a fused group are found in each; text that is not a timeline
 * is refused.
 */
#include <stdlib.h>
#include <string.h>

#include "hvdtest.h"
#include "tap/tap.h"

/* A timeline as lib/core/timeline.c writes it: tensor "a" on track 1 with
 * two ALLREDUCE spans, "b" on track 2 with one, of a group of 2. */
static const char *const written =
    "[\n"
    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":"
    "\"hvd rank 0\"}},\n"
    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":1,\"args\":{"
    "\"name\":\"a\"}},\n"
    "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":2,\"args\":{"
    "\"name\":\"b\"}},\n"
    "{\"name\":\"ALLREDUCE\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":10.5,"
    "\"dur\":2,\"args\":{\"bytes\":16,\"dtype\":\"float32\",\"tensors\":1}},\n"
    "{\"name\":\"ALLREDUCE\",\"ph\":\"X\",\"pid\":0,\"tid\":1,\"ts\":20.25,"
    "\"dur\":2,\"args\":{\"bytes\":16,\"dtype\":\"float32\",\"tensors\":2}},\n"
    "{\"name\":\"ALLREDUCE\",\"ph\":\"X\",\"pid\":0,\"tid\":2,\"ts\":20.25,"
    "\"dur\":2,\"args\":{\"bytes\":16,\"dtype\":\"float32\",\"tensors\":2}},\n"
    "]\n";

/* The same events, keys reordered, keys added, spaces and escapes, an
 * array and an object among the values, and no closing "]". */
static const char *const reordered =
    "[ {\"args\": {\"name\": \"hvd rank 0\"}, \"ph\": \"M\", \"name\": "
    "\"process_name\", \"pid\": 0},\n"
    "  {\"tid\": 1, \"args\": {\"x\": [1, {\"y\": null}], \"name\": \"a\"}, "
    "\"name\": \"thread_name\", \"ph\": \"M\"},\n"
    "  {\"ph\":\"M\",\"new\":true,\"tid\":2,\"name\":\"thread_name\","
    "\"args\":{\"name\":\"b\"}},\n"
    "  {\"ts\": 10.5, \"dur\": 2, \"tid\": 1, \"ph\": \"X\", \"name\": "
    "\"ALLREDUCE\", \"args\": {\"tensors\": 1, \"note\": \"q\\\"\\\\\\u00e9\"}},\n"
    "  {\"args\": {\"tensors\": 2}, \"tid\": 1, \"ts\": 20.25, \"name\": "
    "\"ALLREDUCE\", \"ph\": \"X\", \"s\": \"t\"},\n"
    "  {\"name\": \"ALLREDUCE\", \"tid\": 2, \"ph\": \"X\", \"ts\": 20.25, "
    "\"args\": {\"dtype\": \"float32\", \"tensors\": 2}, \"flag\": false},\n";

static void reads(const char *label, const char *text) {
  int n = 0;
  struct hvdt_event *ev = hvdt_timeline_parse(text, &n);
  is_int(6, n, "%s: 6 events", label);
  if (ev != NULL && n == 6) {
    ok(strcmp(ev[1].name, "thread_name") == 0 && strcmp(ev[1].ph, "M") == 0 &&
           ev[1].tid == 1 && strcmp(ev[1].track, "a") == 0,
       "%s: a track's name, kind, tid and args.name", label);
    ok(strcmp(ev[3].name, "ALLREDUCE") == 0 && strcmp(ev[3].ph, "X") == 0 &&
           ev[3].tid == 1 && ev[3].ts == 10.5 && ev[3].tensors == 1,
       "%s: a span's name, kind, tid, ts and args.tensors", label);
    ok(ev[0].tid == -1 && ev[0].ts == -1 && ev[0].tensors == -1,
       "%s: absent fields are -1", label);
  } else {
    skip(3, "%s: not parsed", label);
  }
  free(ev);
  is_int(1, hvdt_timeline_track(text, "a"), "%s: a's track", label);
  is_int(-1, hvdt_timeline_track(text, "c"), "%s: no track for c", label);
  double ts = 0;
  int found = hvdt_timeline_span(text, "a", "ALLREDUCE", &ts);
  ok(found && ts == 20.25, "%s: a's last ALLREDUCE at 20.25 (got %g)", label,
     ts);
  ok(!hvdt_timeline_span(text, "a", "BROADCAST", NULL),
     "%s: a has no BROADCAST", label);
  const char *ab[2] = {"a", "b"};
  ok(hvdt_timeline_fused(text, ab, 2, "ALLREDUCE"),
     "%s: a and b ran as one group of 2", label);
}

int main(void) {
  plan(20);
  reads("as written", written);
  reads("keys reordered", reordered);
  int n = -1;
  ok(hvdt_timeline_parse("{\"name\":\"x\"}", &n) == NULL && n == 0,
     "not an array: refused");
  ok(hvdt_timeline_parse("[{\"name\":\"x\",\"ph\" \"X\"}]", &n) == NULL &&
         n == 0,
     "a member without ':': refused");
  return tap_exit_status();
}
