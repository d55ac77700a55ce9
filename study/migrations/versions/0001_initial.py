"""Schema version 1: the study database as flowtrial 0.1 created it (before migrations).

Revision ID: 0001
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('arms',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(), nullable=False),
    sa.Column('ttft_ms', sa.Float(), nullable=True),
    sa.Column('tokens_per_second', sa.Float(), nullable=True),
    sa.Column('jitter', sa.Float(), nullable=False),
    sa.Column('delivery', sa.String(), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('shaped', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('ground_truth',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('scope', sa.String(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=True),
    sa.Column('truth_model', sa.String(), nullable=False),
    sa.Column('params_json', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('meta',
    sa.Column('key', sa.String(), nullable=False),
    sa.Column('value', sa.String(), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('participants',
    sa.Column('id', sa.String(), nullable=False),
    sa.Column('key_id', sa.String(), nullable=False),
    sa.Column('key_salt', sa.String(), nullable=False),
    sa.Column('key_hash', sa.String(), nullable=False),
    sa.Column('enrolled_index', sa.Integer(), nullable=False),
    sa.Column('consent_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('simulated', sa.Boolean(), nullable=False),
    sa.Column('working_apps_json', sa.String(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('participants', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_participants_key_id'), ['key_id'], unique=True)

    op.create_table('persistence',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cycle_id', sa.String(), nullable=False),
    sa.Column('interval_s', sa.Float(), nullable=False),
    sa.Column('score', sa.Float(), nullable=False),
    sa.Column('persisted', sa.Boolean(), nullable=False),
    sa.Column('checked_against', sa.String(), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('cycle_id', 'interval_s')
    )
    with op.batch_alter_table('persistence', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_persistence_cycle_id'), ['cycle_id'], unique=False)

    op.create_table('studies',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=False),
    sa.Column('design', sa.String(), nullable=False),
    sa.Column('unit', sa.String(), nullable=False),
    sa.Column('time_scale', sa.Float(), nullable=False),
    sa.Column('config_json', sa.Text(), nullable=False),
    sa.Column('config_toml', sa.Text(), nullable=True),
    sa.Column('randomization_fingerprint', sa.String(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('assignments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=False),
    sa.Column('period', sa.Integer(), nullable=False),
    sa.Column('arm', sa.String(), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=True),
    sa.Column('block', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('participant_id', 'period')
    )
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_assignments_participant_id'), ['participant_id'], unique=False)

    op.create_table('cycles',
    sa.Column('id', sa.String(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=False),
    sa.Column('arm', sa.String(), nullable=False),
    sa.Column('task_id', sa.Integer(), nullable=True),
    sa.Column('period', sa.Integer(), nullable=True),
    sa.Column('protocol', sa.String(), nullable=False),
    sa.Column('transport', sa.String(), nullable=False),
    sa.Column('stream', sa.Boolean(), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=False),
    sa.Column('connection_id', sa.String(), nullable=True),
    sa.Column('model', sa.String(), nullable=True),
    sa.Column('upstream', sa.String(), nullable=False),
    sa.Column('upstream_response_id', sa.String(), nullable=True),
    sa.Column('mono_anchor_ns', sa.BigInteger(), nullable=False),
    sa.Column('wall_anchor_ns', sa.BigInteger(), nullable=False),
    sa.Column('t_request_ns', sa.BigInteger(), nullable=False),
    sa.Column('t_upstream_first_ns', sa.BigInteger(), nullable=True),
    sa.Column('t_first_sent_ns', sa.BigInteger(), nullable=True),
    sa.Column('t_last_sent_ns', sa.BigInteger(), nullable=True),
    sa.Column('t_done_ns', sa.BigInteger(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('shaped', sa.Boolean(), nullable=False),
    sa.Column('target_ttft_ms', sa.Float(), nullable=True),
    sa.Column('target_tps', sa.Float(), nullable=True),
    sa.Column('target_jitter', sa.Float(), nullable=True),
    sa.Column('target_delivery', sa.String(), nullable=True),
    sa.Column('draw_json', sa.String(), nullable=True),
    sa.Column('experienced_ttft_ms', sa.Float(), nullable=True),
    sa.Column('generation_wait_ms', sa.Float(), nullable=True),
    sa.Column('achieved_tps', sa.Float(), nullable=True),
    sa.Column('violation', sa.Boolean(), nullable=False),
    sa.Column('violation_ms', sa.Float(), nullable=True),
    sa.Column('tokens_prompt', sa.Integer(), nullable=True),
    sa.Column('tokens_completion', sa.Integer(), nullable=True),
    sa.Column('tokens_sent', sa.Integer(), nullable=True),
    sa.Column('usage_exact', sa.Boolean(), nullable=False),
    sa.Column('tool_calls', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('prompt_fingerprint', sa.Text(), nullable=True),
    sa.Column('content_fingerprint', sa.Text(), nullable=True),
    sa.Column('prompt_text', sa.Text(), nullable=True),
    sa.Column('content_text', sa.Text(), nullable=True),
    sa.Column('content_chars', sa.Integer(), nullable=True),
    sa.Column('simulated', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('cycles', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_cycles_arm'), ['arm'], unique=False)
        batch_op.create_index(batch_op.f('ix_cycles_participant_id'), ['participant_id'], unique=False)
        batch_op.create_index('ix_cycles_participant_request', ['participant_id', 't_request_ns'], unique=False)

    op.create_table('events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=False),
    sa.Column('cycle_id', sa.String(), nullable=True),
    sa.Column('kind', sa.String(), nullable=False),
    sa.Column('ts_ns', sa.BigInteger(), nullable=False),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('source', sa.String(), nullable=False),
    sa.Column('payload_json', sa.Text(), nullable=True),
    sa.Column('dedupe_key', sa.String(), nullable=True),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedupe_key')
    )
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_events_cycle_id'), ['cycle_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_kind'), ['kind'], unique=False)
        batch_op.create_index(batch_op.f('ix_events_participant_id'), ['participant_id'], unique=False)
        batch_op.create_index('ix_events_participant_ts', ['participant_id', 'ts_ns'], unique=False)

    op.create_table('questionnaire_answers',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=False),
    sa.Column('task_id', sa.Integer(), nullable=True),
    sa.Column('instrument', sa.String(), nullable=False),
    sa.Column('item', sa.String(), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('answered_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('questionnaire_answers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_questionnaire_answers_participant_id'), ['participant_id'], unique=False)

    op.create_table('tasks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('participant_id', sa.String(), nullable=False),
    sa.Column('name', sa.String(), nullable=False),
    sa.Column('description', sa.String(), nullable=True),
    sa.Column('period', sa.Integer(), nullable=True),
    sa.Column('arm', sa.String(), nullable=True),
    sa.Column('forecast_fast_s', sa.Float(), nullable=True),
    sa.Column('forecast_slow_s', sa.Float(), nullable=True),
    sa.Column('started_at_ns', sa.BigInteger(), nullable=True),
    sa.Column('ended_at_ns', sa.BigInteger(), nullable=True),
    sa.Column('status', sa.String(), nullable=False),
    sa.Column('time_s', sa.Float(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['participant_id'], ['participants.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('participant_id', 'name')
    )
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tasks_participant_id'), ['participant_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('tasks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tasks_participant_id'))

    op.drop_table('tasks')
    with op.batch_alter_table('questionnaire_answers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_questionnaire_answers_participant_id'))

    op.drop_table('questionnaire_answers')
    with op.batch_alter_table('events', schema=None) as batch_op:
        batch_op.drop_index('ix_events_participant_ts')
        batch_op.drop_index(batch_op.f('ix_events_participant_id'))
        batch_op.drop_index(batch_op.f('ix_events_kind'))
        batch_op.drop_index(batch_op.f('ix_events_cycle_id'))

    op.drop_table('events')
    with op.batch_alter_table('cycles', schema=None) as batch_op:
        batch_op.drop_index('ix_cycles_participant_request')
        batch_op.drop_index(batch_op.f('ix_cycles_participant_id'))
        batch_op.drop_index(batch_op.f('ix_cycles_arm'))

    op.drop_table('cycles')
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_assignments_participant_id'))

    op.drop_table('assignments')
    op.drop_table('studies')
    with op.batch_alter_table('persistence', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_persistence_cycle_id'))

    op.drop_table('persistence')
    with op.batch_alter_table('participants', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_participants_key_id'))

    op.drop_table('participants')
    op.drop_table('meta')
    op.drop_table('ground_truth')
    op.drop_table('arms')
