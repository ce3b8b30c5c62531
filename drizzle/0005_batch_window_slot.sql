-- A batch call holds one window pool slot for all its items: only one of its reservations carries it.
ALTER TABLE "reservations" ADD COLUMN "window_slot" boolean DEFAULT true NOT NULL;