// Type declarations for the quotad client (index.mjs).

export declare const DEFAULT_SOCKET: string;
export declare const DEFAULT_TIMEOUT_MS: number;

/** How a take, peek, release or settle names its quota: a policy, or an inline limit. */
export interface Address {
  /** A policy in the sidecar's config (instead of the inline fields). */
  policy?: string;
  /** Fixed window, sliding window and concurrency: the limit. */
  limit?: number;
  /** Fixed and sliding window: the window in milliseconds. */
  window_ms?: number;
  algorithm?: 'fixed_window' | 'token_bucket' | 'concurrency' | 'sliding_window' | 'calendar';
  /** Token bucket: tokens added per period_ms. */
  rate?: number;
  period_ms?: number;
  /** Token bucket: tokens the bucket holds (default rate). */
  burst?: number;
  /** Concurrency: how long a lease lives unless renewed. */
  lease_ms?: number;
  /** Calendar: the period counted, in time_zone's wall clock. */
  period?: 'minute' | 'hour' | 'day' | 'week' | 'month';
  /** Calendar: an IANA zone name such as 'Asia/Shanghai'; default 'UTC'. */
  time_zone?: string;
  /** Calendar, a week period only: its first day; default 'monday'. */
  week_start?: 'monday' | 'tuesday' | 'wednesday' | 'thursday' | 'friday' | 'saturday' | 'sunday';
  /** Calendar: move this subject's boundaries later by up to this many ms (less than one period). */
  jitter_ms?: number;
  /** Shortens the sidecar's Redis deadline for this request. */
  timeout_ms?: number;
}

export interface CallOptions {
  /** Milliseconds this call may take here, reconnecting included. */
  timeoutMs?: number;
}

/** Asks a take or peek for its reply's RateLimit header fields. */
export interface HeadersOption {
  /** true adds the reply's headers field; false or absent sends nothing. */
  headers?: boolean;
}

/**
 * The caller's W3C trace context, so that the decision joins its trace.
 * Absent, the span active in @opentelemetry/api is sent when the application
 * has that package; null sends none.
 */
export interface TraceOptions {
  /** The traceparent header's value: 00-<trace-id>-<span-id>-<flags>. */
  traceparent?: string | null;
  /** The tracestate header's value that goes with it. */
  tracestate?: string;
}

export interface TakeOptions extends Address, CallOptions, HeadersOption, TraceOptions {
  /** Units to take; default 1. */
  cost?: number;
  /** Idempotency key; also what makes a take safe to resend after a lost connection. */
  request_id?: string;
}

export type PeekOptions = Address & CallOptions & HeadersOption & TraceOptions;

export interface SettleOptions extends Omit<Address, 'lease_ms'>, CallOptions, HeadersOption, TraceOptions {
  /** The accepted take's request_id. */
  request_id: string;
  /** The take's actual cost, 0 (a refund) to 1000000000: lower gives back, higher consumes past the limit. */
  cost: number;
}

/** One limit of a take of several (takeChecks): addressed as for take, with its own cost. */
export interface Check extends Omit<Address, 'timeout_ms'> {
  subject: string;
  /** Units this check takes; default the take's cost. */
  cost?: number;
}

/** The take's own options for takeChecks. */
export interface TakeChecksOptions extends CallOptions, HeadersOption, TraceOptions {
  /** Units each check takes unless it gives its own; default 1. */
  cost?: number;
  /** Idempotency key of the whole take; also what makes it safe to resend. */
  request_id?: string;
  /** Shortens the sidecar's Redis deadline for this request. */
  timeout_ms?: number;
}

export interface ReleaseOptions extends CallOptions, TraceOptions {
  policy?: string;
  algorithm?: 'concurrency';
  limit?: number;
  lease_ms?: number;
  timeout_ms?: number;
}

export interface ClientOptions {
  /** Milliseconds each call may take by default (5000); 0 means no limit. */
  timeoutMs?: number;
}

/**
 * The IETF RateLimit header fields of a decision, by field name: values to
 * copy into an HTTP response as they are. RateLimit is absent from a degraded
 * answer, Retry-After from all but a denied take.
 */
export interface RateLimitHeaders {
  'RateLimit-Policy'?: string;
  RateLimit?: string;
  'Retry-After'?: string;
}

export interface TakeReply {
  ok: true;
  allowed: boolean;
  replay: boolean;
  limit: number;
  used: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
  /** Only on a granted concurrency lease. */
  lease_ms?: number;
  /** Only for a policy in shadow mode. */
  shadow?: true;
  shadow_allowed?: boolean;
  /** Only when Redis could not decide and the policy's on_unavailable did. */
  degraded?: true;
  /** Only when allowed from units the sidecar reserved (an allotment). */
  local?: true;
  /** Only when asked with { headers: true }. */
  headers?: RateLimitHeaders;
}

/** One check's decision in a MultiTakeReply. */
export interface CheckReply {
  /** This check's own verdict; in a denied take, one with room says true and consumed nothing. */
  allowed: boolean;
  replay: boolean;
  limit: number;
  used: number;
  remaining: number;
  reset_ms: number;
  retry_after_ms: number;
  lease_ms?: number;
  shadow?: true;
  shadow_allowed?: boolean;
  degraded?: true;
  /** The local denial answered the take without asking about this check. */
  skipped?: true;
}

/** The reply to a take of several limits. */
export interface MultiTakeReply {
  ok: true;
  /** Every check consumed; false when none did. */
  allowed: boolean;
  /** Every check replayed its acceptance of this request_id. */
  replay: boolean;
  /** When denied, the largest retry_after_ms of the checks that denied. */
  retry_after_ms: number;
  degraded?: true;
  checks: CheckReply[];
  /** Only when asked with { headers: true }: one member per check. */
  headers?: RateLimitHeaders;
}

export interface PeekReply {
  ok: true;
  limit: number;
  used: number;
  remaining: number;
  reset_ms: number;
  /** Only when asked with { headers: true }. */
  headers?: RateLimitHeaders;
}

export interface ReleaseReply {
  ok: true;
  released: boolean;
  limit: number;
  used: number;
  remaining: number;
}

export interface SettleReply {
  ok: true;
  /** false: the state holds no take of that request_id (its window ended, say); nothing changed. */
  settled: boolean;
  /** Settled before with the same cost; nothing changed now. */
  replay: boolean;
  /** The cost the take reserved; 0 when not settled. */
  reserved: number;
  limit: number;
  used: number;
  remaining: number;
  reset_ms: number;
  /** What a take of cost 1 would be told now. */
  retry_after_ms: number;
  /** Only when asked with { headers: true }. */
  headers?: RateLimitHeaders;
}

export interface PingReply {
  ok: true;
  store: 'redis' | 'embedded';
  redis_ok: boolean;
  version: string;
  ready: boolean;
  redis_error?: string;
}

export interface ErrorReply {
  id?: string | number;
  ok: false;
  error: string;
  message: string;
}

/** A raw protocol request, as sent by request() and pipeline(). */
export interface RawRequest {
  op: string;
  id?: string | number;
  [field: string]: unknown;
}

/** A raw reply; check ok before reading the other fields. */
export type RawReply = { ok: boolean; id?: string | number; [field: string]: unknown };

/** Base of every error this package rejects with. */
export declare class QuotadError extends Error {
  constructor(code: string, message: string, reply?: ErrorReply | null);
  /** The protocol's code, or CONNECTION, TIMEOUT, OUTCOME_UNKNOWN. */
  readonly code: string;
  readonly message: string;
  /** The sidecar's whole error reply, when there was one. */
  readonly reply: ErrorReply | null;
}
export declare class Invalid extends QuotadError {}
export declare class TooLarge extends QuotadError {}
export declare class UnknownPolicy extends QuotadError {}
export declare class Conflict extends QuotadError {}
export declare class PolicyMismatch extends QuotadError {}
export declare class WrongType extends QuotadError {}
export declare class RequestIdsFull extends QuotadError {}
export declare class Unavailable extends QuotadError {}
export declare class ShuttingDown extends QuotadError {}
export declare class Internal extends QuotadError {}
export declare class ConnectionError extends QuotadError {
  constructor(message: string, code?: string);
}
export declare class Timeout extends ConnectionError {
  constructor(message: string);
}
export declare class OutcomeUnknown extends QuotadError {
  constructor(message: string, reply?: ErrorReply | null);
}

/** The reply's header fields as a new object; empty when it has none. */
export declare function rateLimitHeaders(reply: TakeReply | MultiTakeReply | PeekReply | SettleReply | RawReply): Record<string, string>;

/** The error class instance for an error reply. */
export declare function errorFromReply(reply: ErrorReply): QuotadError;

export declare class Client {
  constructor(path?: string, options?: ClientOptions);
  /** A client connected at once; rejects with ConnectionError if the socket does not answer. */
  static connect(path?: string, options?: ClientOptions): Promise<Client>;
  /** Connections opened after the first one. */
  readonly reconnects: number;
  take(subject: string, options?: TakeOptions): Promise<TakeReply>;
  /** Several limits in one all-or-nothing take. */
  takeChecks(checks: Check[], options?: TakeChecksOptions): Promise<MultiTakeReply>;
  peek(subject: string, options?: PeekOptions): Promise<PeekReply>;
  release(subject: string, request_id: string, options?: ReleaseOptions): Promise<ReleaseReply>;
  settle(subject: string, options: SettleOptions): Promise<SettleReply>;
  ping(options?: CallOptions): Promise<PingReply>;
  request(req: RawRequest, options?: CallOptions): Promise<RawReply>;
  pipeline(reqs: Iterable<RawRequest>, options?: CallOptions): Promise<RawReply[]>;
  close(): Promise<void>;
}
