/**
 * The API's shapes, named. Every type here comes from `src/openapi.ts`,
 * which `npm run generate` writes from the repository's `openapi.yaml`
 * (openapi-typescript); a test regenerates it and fails if it differs.
 */
import type { components, operations } from "./openapi.js";

type Schemas = components["schemas"];

export type Charge = Schemas["Charge"];
export type ChargeRequest = Schemas["ChargeRequest"];
export type Refund = Schemas["Refund"];
export type RefundRequest = Schemas["RefundRequest"];
export type CaptureRequest = Schemas["CaptureRequest"];
export type Dispute = Schemas["Dispute"];
export type Event = Schemas["Event"];
export type EventType = Schemas["EventType"];
export type ChargeList = Schemas["ChargeList"];
export type EventList = Schemas["EventList"];
export type ErrorBody = Schemas["Error"];
/** The `code` of an error envelope, as the server documents it. */
export type ApiErrorCode = ErrorBody["error"]["code"];

type Query<Op extends keyof operations> = NonNullable<operations[Op]["parameters"]["query"]>;

/** `GET /api/charges`'s filters; the client pages with `starting_after` itself. */
export type ListChargesParams = Omit<Query<"listCharges">, "starting_after" | "ending_before">;
/** `GET /api/events`'s filters; the client pages with `starting_after` itself. */
export type ListEventsParams = Omit<Query<"listEvents">, "starting_after" | "ending_before">;
