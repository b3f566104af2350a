// The live event stream. EventSource cannot send an Authorization header, so the stream is read
// with fetch() and parsed here (the text/event-stream format: fields, blank line ends an event).
// It reconnects by itself, resuming after the last event seen (Last-Event-ID).

import { authHeaders } from "./api.js";

const MAX_BACKOFF_MS = 15000;

/** Parse a text/event-stream body; calls onEvent({id, event, data}) per event. */
export async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let fields = { data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.search(/\r\n|\r|\n/)) >= 0) {
      const line = buffer.slice(0, end);
      buffer = buffer.slice(end + (buffer.startsWith("\r\n", end) ? 2 : 1));
      if (line === "") {
        if (fields.data.length > 0) {
          onEvent({ id: fields.id, event: fields.event ?? "message", data: fields.data.join("\n") });
        }
        fields = { data: [] };
      } else if (!line.startsWith(":")) {
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        const raw = colon < 0 ? "" : line.slice(colon + 1);
        const text = raw.startsWith(" ") ? raw.slice(1) : raw;
        if (name === "data") fields.data.push(text);
        else if (name === "id" || name === "event") fields[name] = text;
      }
    }
  }
}

/**
 * Follow /v1/events until stop() is called. onEvent gets each event (seq as a number),
 * onState "live" | "reconnecting" | "signed-out", onError the reason for a lost stream.
 */
export function follow({ onEvent, onState }) {
  const control = new AbortController();
  let lastId = null;
  let backoff = 500;

  async function once() {
    const headers = { Accept: "text/event-stream", ...authHeaders() };
    if (lastId !== null) headers["Last-Event-ID"] = lastId;
    const response = await fetch("/v1/events", { headers, signal: control.signal });
    if (response.status === 401) {
      onState("signed-out");
      return false;
    }
    if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
    onState("live");
    backoff = 500;
    await readEvents(response.body, (message) => {
      if (message.id !== undefined) lastId = message.id;
      let event = null;
      try {
        event = JSON.parse(message.data);
      } catch {
        return; // not ours to show
      }
      onEvent({ seq: Number(message.id), type: message.event, event });
    });
    return true;
  }

  (async () => {
    while (!control.signal.aborted) {
      try {
        if (!(await once())) return;
      } catch (e) {
        if (control.signal.aborted) return;
      }
      onState("reconnecting");
      await new Promise((done) => setTimeout(done, backoff));
      backoff = Math.min(MAX_BACKOFF_MS, backoff * 2);
    }
  })();
  return { stop: () => control.abort() };
}
