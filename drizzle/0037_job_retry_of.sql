-- Job.retryOf: the FAILED or CANCELLED job a job was submitted again from (retryJob).
ALTER TABLE "jobs" ADD COLUMN "retry_of" uuid;