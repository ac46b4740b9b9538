/**
 * Verifying the server's webhooks in a Node receiver:
 * `import { verifyWebhook } from "@payments/client/webhooks"`. A separate
 * entry point, so that browser and React Native bundles of the main one
 * never import `node:crypto`.
 */
import { createHmac, timingSafeEqual } from "node:crypto";
import type { Event } from "./types.js";

/** The request header that carries the signature. */
export const SIGNATURE_HEADER = "Payments-Signature";

/** How far `t` may be from this clock, either way: 5 minutes. */
export const DEFAULT_TOLERANCE_SECONDS = 300;

/** Why a delivery was refused: answer it 400. */
export class WebhookVerificationError extends Error {
  override readonly name = "WebhookVerificationError";
  readonly reason: "malformed" | "mismatch" | "stale";
  constructor(reason: "malformed" | "mismatch" | "stale", message: string) {
    super(message);
    this.reason = reason;
  }
}

export interface VerifyOptions {
  toleranceSeconds?: number;
  /** Unix seconds; default this machine's clock. */
  now?: number;
}

/**
 * The event of a genuine delivery, else a `WebhookVerificationError`.
 *
 * `header` is the request's `Payments-Signature` (`t=…,v1=…[,v1=…]`; as
 * Node's `req.headers` gives it);
 * `rawBody` is the body **as received**, before any JSON parsing (a body
 * parsed and serialised again does not have the same bytes). `secret` may
 * be several during a rotation: the delivery is genuine if any `v1` is the
 * HMAC-SHA256 of `"{t}.{rawBody}"` under any of them (compared in constant
 * time), and `t` is within the tolerance of now. Only then is the body parsed.
 */
export function verifyWebhook(
  secret: string | readonly string[],
  header: string | readonly string[] | null | undefined,
  rawBody: string | Uint8Array,
  options: VerifyOptions = {},
): Event {
  // Node gives a header sent twice as an array: one is required.
  const one =
    typeof header === "string" || header == null ? (header ?? "") : header.length === 1 ? header[0] : "";
  const { timestamp, signatures } = parseHeader(one ?? "");
  const body = typeof rawBody === "string" ? Buffer.from(rawBody, "utf8") : Buffer.from(rawBody);
  const secrets = typeof secret === "string" ? [secret] : secret;
  const matched = secrets.some((one) => {
    const expected = createHmac("sha256", one).update(`${timestamp}.`).update(body).digest();
    // Every v1 is compared, so the time taken does not say which matched.
    return signatures.reduce((found, given) => sameBytes(expected, given) || found, false);
  });
  if (!matched) throw new WebhookVerificationError("mismatch", "no v1 signature matches");
  const now = options.now ?? Math.floor(Date.now() / 1000);
  const tolerance = options.toleranceSeconds ?? DEFAULT_TOLERANCE_SECONDS;
  if (Math.abs(now - Number(timestamp)) > tolerance) {
    throw new WebhookVerificationError(
      "stale",
      `signature timestamp ${timestamp} is outside the tolerance (now ${now})`,
    );
  }
  try {
    return JSON.parse(body.toString("utf8")) as Event;
  } catch {
    throw new WebhookVerificationError("malformed", "the signed body is not JSON");
  }
}

function parseHeader(header: string): { timestamp: string; signatures: Buffer[] } {
  const malformed = (why: string) =>
    new WebhookVerificationError("malformed", `malformed ${SIGNATURE_HEADER} header: ${why}`);
  const timestamps: string[] = [];
  const signatures: Buffer[] = [];
  for (const item of header.split(",")) {
    const at = item.indexOf("=");
    if (at < 0) continue;
    const [name, value] = [item.slice(0, at).trim(), item.slice(at + 1).trim()];
    if (name === "t") timestamps.push(value);
    // A v1 that is not 64 hex digits can match nothing: an empty buffer.
    if (name === "v1")
      signatures.push(/^[0-9a-fA-F]{64}$/.test(value) ? Buffer.from(value, "hex") : Buffer.alloc(0));
  }
  const [timestamp] = timestamps;
  if (timestamps.length !== 1 || timestamp === undefined) throw malformed("one t is required");
  if (!/^[0-9]{1,12}$/.test(timestamp)) throw malformed("t is not Unix seconds");
  if (signatures.length === 0) throw malformed("no v1");
  return { timestamp, signatures };
}

function sameBytes(expected: Buffer, given: Buffer): boolean {
  return given.length === expected.length && timingSafeEqual(expected, given);
}
